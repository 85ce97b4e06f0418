"""A shadow run never reaches the outside world: outbound connections refused in its activity.

A shadow activity's fenced writes are captured and rolled back, and its external calls through
the fence are recorded, not sent. A body that reaches the network by other means (an HTTP
client of its own, an SDK) would make a real effect in a phase sold as side-effect-free, so
while a shadow body runs, a Python-level ``socket.connect`` to anything but the allowed
addresses (the sink's, Temporal's, ``BRIDGE_SHADOW_ALLOW``) raises ``ShadowEgressRefused``: the
shadow fails loudly instead of charging. A task the DAG declares side-effect-free is not
guarded.

It cannot see what a process the body starts connects to (a virtualenv's ``pip install`` from
PyPI, a callable run in another interpreter, a bash command), so starting a process is refused
the same way (``subprocess``, ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.spawn*``).

Limits: the guard sees connections made through Python's ``socket`` module in the activity's
own context (its thread); libpq (psycopg) and Temporal's core connect in C/Rust and are not
seen, nor is a thread the body starts itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg


class _Guard:
    """The addresses a guarded block may reach, and the refusals it met."""

    def __init__(self, allowed: frozenset[tuple[str, int]]) -> None:
        self.allowed = allowed
        self.refused: list[str] = []


_GUARD: contextvars.ContextVar[_Guard | None] = contextvars.ContextVar(
    "bridge_shadow_egress", default=None
)
_LOCAL = {"localhost": "127.0.0.1", "::1": "127.0.0.1"}
#: The audit events of starting a process, whose connections the guard cannot see.
_PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"}
)
_installed = False


class ShadowEgressRefused(PermissionError):
    """A shadow body tried to connect somewhere it may not: it would have made a real effect."""


def _normal(host: str) -> str:
    return _LOCAL.get(host, host)


def _program(event: str, args: tuple[Any, ...]) -> str:
    """The name of the program a process event starts, never its arguments (they may hold a
    secret: a password on a command line)."""
    what: Any = args[1] if event == "subprocess.Popen" and args[1] else args[0] if args else ""
    if isinstance(what, list | tuple):
        what = what[0] if what else ""
    words = os.fsdecode(what).split() if isinstance(what, str | bytes | os.PathLike) else []
    words = [w for w in words if "=" not in w]  # a shell's NAME=value before the program
    return os.path.basename(words[0]) if words else "?"


def _hook(
    event: str,
    args: tuple[Any, ...],
    _process_events: frozenset[str] = _PROCESS_EVENTS,
    _guard: contextvars.ContextVar[_Guard | None] = _GUARD,
) -> None:
    # what it reads is bound at definition: at interpreter exit the module's globals are
    # cleared while audit hooks still run
    if event != "socket.connect" and event not in _process_events:
        return
    guard = _guard.get()
    if guard is None:
        return
    if event in _process_events:
        message = (
            f"a shadow run may not start a process ({event} {_program(event, args)!r}): the guard "
            "cannot see what it connects to (a virtualenv's pip install, a callable in another "
            "interpreter, a bash command); declare the task side-effect-free if it has none"
        )
        guard.refused.append(message)
        raise ShadowEgressRefused(message)
    sock, address = args
    if getattr(sock, "family", None) == socket.AF_UNIX:
        return  # local sockets (the lease agent)
    if not (isinstance(address, tuple) and len(address) >= 2):
        return
    target = (_normal(str(address[0])), int(address[1]))
    if target not in guard.allowed:
        message = (
            f"a shadow run may not connect to {target[0]}:{target[1]}: it would reach the "
            "outside world (make the call through fence.external_call, which records it in "
            "shadow, or declare the task side-effect-free)"
        )
        guard.refused.append(message)
        raise ShadowEgressRefused(message)


def _install() -> None:
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


def address_of_dsn(dsn: str) -> tuple[str, int] | None:
    """The (host, port) of a libpq DSN, or None for a local socket."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "")
    if not host or host.startswith("/"):
        return None
    return _normal(host), int(params.get("port") or 5432)


def allowed_addresses(sink_dsn: str | None) -> frozenset[tuple[str, int]]:
    """What a shadow body may connect to: the sink, Temporal, ``BRIDGE_SHADOW_ALLOW``."""
    found: set[tuple[str, int]] = set()
    if sink_dsn:
        sink = address_of_dsn(sink_dsn)
        if sink is not None:
            found.add(sink)
    extra = [os.environ.get("BRIDGE_TEMPORAL_ADDR", "")]
    extra += os.environ.get("BRIDGE_SHADOW_ALLOW", "").split(",")
    for entry in extra:
        host, _, port = entry.strip().rpartition(":")
        if host and port.isdigit():
            found.add((_normal(host), int(port)))
    return frozenset(found)


@contextlib.contextmanager
def no_egress(allowed: Iterable[tuple[str, int]]) -> Iterator[None]:
    """Within the block (this context), outbound connections outside ``allowed`` are refused.

    A refusal fails the block with ``ShadowEgressRefused`` even when the body's client wrapped
    the refusal in an error of its own (an SDK's "connection error", which it would retry) or
    swallowed it.
    """
    _install()
    guard = _Guard(frozenset((_normal(h), p) for h, p in allowed))
    token = _GUARD.set(guard)
    try:
        yield
    except BaseException as exc:
        if guard.refused and not isinstance(exc, ShadowEgressRefused):
            raise ShadowEgressRefused(guard.refused[0]) from exc
        raise
    finally:
        _GUARD.reset(token)
    if guard.refused:
        raise ShadowEgressRefused(guard.refused[0])
