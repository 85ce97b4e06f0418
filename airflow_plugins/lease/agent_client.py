"""A task process's side of the lease agent (``airflow_plugins.lease.agent``).

``AgentClient.tuples`` sends one of the store's hot statements to the agent and returns its
rows, or None when the statement certainly did not run there (no agent listens on the socket,
or the agent serves another store or refused the request): the caller then runs it on a
connection of its own. Once the agent has the request, what it answers is final: an agent
that cannot reach Postgres, or that dies while the request is in flight, is a store outage
(``LeaseStoreUnavailable``), as a dropped connection of the caller's own would be, because the
statement may have run.

Before it sends anything, the client asks the kernel who serves the socket (``SO_PEERCRED``):
an agent running as another user than ``uid`` (default: this process's own) is not trusted
with the request nor believed, and the client connects itself.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
from collections.abc import Mapping
from typing import Any

import psycopg

from airflow_plugins.lease import wire
from airflow_plugins.lease.errors import LeaseStoreUnavailable

log = logging.getLogger(__name__)


class AgentClient:
    """Sends lease statements to the agent listening on ``path``.

    Args:
        path: the agent's Unix socket.
        conninfo: the store this client means; an agent serving another one is not used.
        timeout: seconds to wait for an answer (the agent's own wait for a connection, plus
            the statement).
        uid: the user the agent must run as (default: this process's own).
    """

    def __init__(self, path: str, conninfo: str, *, timeout: float, uid: int | None = None) -> None:
        self.path = path
        self.uid = os.getuid() if uid is None else uid
        self.store = wire.store_identity(conninfo)
        self.timeout = timeout
        self.refused: str | None = None  # why this process stopped asking the agent

    def listening(self) -> bool:
        """Whether a socket is at the agent's path (without asking it anything)."""
        try:
            return stat.S_ISSOCK(os.stat(self.path).st_mode)
        except OSError:
            return False

    def ping(self) -> bool:
        """Whether the agent answers for this client's store (a warm-up for the first call)."""
        return self.status() is not None

    def status(self) -> dict[str, Any] | None:
        """The agent's answer to a ping (its store, requests ``served`` and ``failed``), or
        None when no agent answers for this client's store."""
        try:
            answer = self._ask(wire.ping_request(self.store))
        except LeaseStoreUnavailable as exc:
            log.info("exactly-once: the lease agent did not answer a ping: %s", exc)
            return None
        return answer if answer is not None and answer.get("store") == self.store else None

    def tuples(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]] | None:
        """The rows of statement ``name``, run by the agent; None when it did not run there.

        Raises:
            LeaseStoreUnavailable: the agent took the request but could not answer it.
            psycopg.Error: the statement failed in the database (as if run directly).
        """
        answer = self._ask(wire.request(self.store, name, params))
        if answer is None:
            return None
        if "rows" in answer:
            return wire.decode_rows(answer["rows"])
        if "unavailable" in answer:
            raise LeaseStoreUnavailable(f"lease store unavailable: {answer['unavailable']}")
        raise _database_error(answer.get("sqlstate"), str(answer.get("error")))

    def _ask(self, line: bytes) -> dict[str, Any] | None:
        if self.refused is not None:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
            except OSError:
                return None  # nobody listens: nothing was sent
            if not self._trusted(sock):
                return None
            try:
                sock.sendall(line)
                answer = wire.read_line(sock)
                if not answer.endswith(b"\n"):
                    raise ConnectionResetError("the connection ended before a whole answer")
            except OSError as exc:
                raise LeaseStoreUnavailable(
                    f"lease store unavailable: the lease agent on {self.path} did not answer: {exc}"
                ) from exc
        finally:
            sock.close()
        try:
            body: dict[str, Any] = json.loads(answer)
        except ValueError as exc:
            raise LeaseStoreUnavailable(
                f"lease store unavailable: the lease agent on {self.path} answered {answer[:200]!r}"
            ) from exc
        if "refused" in body:
            self.refused = str(body["refused"])
            log.warning(
                "exactly-once: the lease agent on %s refused this process (%s); it connects to "
                "the lease store itself",
                self.path,
                self.refused,
            )
            return None
        return body

    def _trusted(self, sock: socket.socket) -> bool:
        # asked of the kernel, before anything is sent: whoever serves the socket sees the request
        try:
            peer = wire.peer_of(sock)
        except OSError as exc:
            self.refused = f"the owner of the socket could not be checked: {exc}"
        else:
            if peer.uid == self.uid:
                return True
            self.refused = (
                f"the process serving the socket (pid {peer.pid}) runs as uid {peer.uid}, "
                f"not {self.uid}"
            )
        log.warning(
            "exactly-once: not trusting the lease agent on %s (%s); this process connects to "
            "the lease store itself",
            self.path,
            self.refused,
        )
        return False


def _database_error(sqlstate: object, message: str) -> psycopg.Error:
    # the class psycopg raises for that SQLSTATE when the statement runs directly
    try:
        error: type[psycopg.Error] = psycopg.errors.lookup(str(sqlstate))
    except KeyError:
        error = psycopg.DatabaseError
    return error(message)
