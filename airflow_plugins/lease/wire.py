"""What the lease agent and its clients send each other: one JSON line each way.

A request names one of the store's hot statements (``AGENT_QUERIES``) and its parameters; the
answer carries its rows. Dates and timestamps have no JSON form, and a JSON object in a row
(a holder, a recorded result) must come back as it was, so every value travels tagged:
``["v", json]``, ``["d", "2024-02-15"]`` or ``["t", "2024-02-15T02:00:00+00:00"]``.

A request also names the store its client means (``store_identity``): an agent serving another
database refuses it, and the client then connects itself.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from psycopg.conninfo import conninfo_to_dict

# the statements of a protected try (queries.sql); nothing else is relayed
AGENT_QUERIES = frozenset({"acquire", "acquire_decided", "acquire_batch", "renew", "finish"})
_CREDENTIALS = struct.Struct("3i")
# a request or answer longer than this is refused (a result is at most 1 MiB of JSON)
MAX_LINE = 8 * 1024 * 1024


def store_identity(conninfo: str) -> str:
    """``user@host:port/dbname`` of a libpq connection string or URL, without secrets.

    Two spellings of one store agree when they name the same host the same way; ``localhost``
    and ``127.0.0.1`` differ (a refused agent costs a direct connection, never a wrong store).
    """
    parts = conninfo_to_dict(conninfo)
    user = parts.get("user") or ""
    host = parts.get("host") or parts.get("hostaddr") or ""
    port = parts.get("port") or "5432"
    return f"{user}@{host}:{port}/{parts.get('dbname') or user}"


def encode(value: Any) -> list[Any]:
    """One value, tagged with its type."""
    if isinstance(value, datetime):
        return ["t", value.isoformat()]
    if isinstance(value, date):
        return ["d", value.isoformat()]
    return ["v", value]


def decode(tagged: Sequence[Any]) -> Any:
    """The value ``encode`` tagged.

    Raises:
        ValueError: not a tagged value.
    """
    if not isinstance(tagged, list | tuple) or len(tagged) != 2:
        raise ValueError(f"not a tagged value: {tagged!r}")
    tag, value = tagged
    if tag == "v":
        return value
    if tag == "t":
        return datetime.fromisoformat(value)
    if tag == "d":
        return date.fromisoformat(value)
    raise ValueError(f"unknown tag {tag!r}")


def request(store: str, name: str, params: Mapping[str, Any]) -> bytes:
    """The line asking for statement ``name`` with ``params`` on ``store``."""
    body = {"store": store, "query": name, "params": {k: encode(v) for k, v in params.items()}}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def ping_request(store: str) -> bytes:
    """The line asking the agent for its status (the store it serves, its counters)."""
    return answer(store=store, ping=True)


def rows_answer(rows: Sequence[Sequence[Any]]) -> bytes:
    """The line answering with ``rows``."""
    body = {"rows": [[encode(v) for v in row] for row in rows]}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def answer(**fields: Any) -> bytes:
    """Any other line: an answer (``refused``, ``unavailable``, ``error``, a ping's status)."""
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def decode_rows(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """The rows of a ``rows`` answer."""
    return [tuple(decode(v) for v in row) for row in rows]


def decode_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of a request."""
    return {str(k): decode(v) for k, v in params.items()}


def read_line(sock: socket.socket, *, deadline: float | None = None) -> bytes:
    """Reads up to and with the first newline; less when the peer closes first or the line
    passes ``MAX_LINE`` (the caller sees no newline at the end then).

    Args:
        sock: the connection.
        deadline: ``time.monotonic()`` by which the whole line must be in (not each chunk:
            a peer sending a byte at a time is not waited for longer).

    Raises:
        TimeoutError: the deadline passed first.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the whole line did not arrive in time")
            sock.settimeout(remaining)
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n") or size > MAX_LINE:
            return b"".join(chunks)


@dataclasses.dataclass(frozen=True)
class Peer:
    """The process on the other end of a Unix socket, as the kernel reports it."""

    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    """The credentials of ``sock``'s peer (``SO_PEERCRED``, Linux): who really is there.

    Raises:
        OSError: the kernel could not tell (not a connected Unix socket).
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    pid, uid, gid = _CREDENTIALS.unpack(raw)
    return Peer(pid, uid, gid)
