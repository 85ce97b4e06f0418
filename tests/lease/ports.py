"""Ports for the lease tests: only from engineer A's range, 25432-25499."""

from __future__ import annotations

import socket

FIRST, LAST = 25432, 25499


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def closed_port() -> int:
    """A port of the range where nothing listens (for an unreachable lease store)."""
    for port in range(LAST, LAST - 10, -1):
        if not _listening(port):
            return port
    raise RuntimeError(f"no closed port in {LAST - 9}-{LAST}")


def free_port(start: int = FIRST) -> int:
    """A port of the range that can be bound now (for a private Postgres server)."""
    for port in range(start, LAST - 10):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{LAST - 10}")
