"""Ends a lease-store call that overruns its time on the client's own clock.

A route that black-holes packets after the kernel acknowledged them (or a proxy that stopped
forwarding) leaves a call waiting on an answer that never comes, and no TCP timeout fires:
the data was acknowledged. The watchdog, one thread per process started on first use, shuts
down the socket of a connection whose call is still running at its deadline; the call then
fails at once as a dropped connection (``LeaseStoreUnavailable``), and the connection is not
used again.
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg


@dataclasses.dataclass(eq=False)
class BoundedCall:
    """One call in progress: its connection, its deadline, whether the watchdog ended it."""

    conn: psycopg.Connection[Any]
    deadline: float
    overran: bool = False


class CallWatchdog:
    """Watches calls in progress; see the module docstring."""

    def __init__(self) -> None:
        self._reset()
        # a task process forked from a parent that used the watchdog has no thread of it
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._calls: set[BoundedCall] = set()
        self._running = False
        # when the thread wakes next (None: only when told); a later deadline needs no wake-up
        self._wakes_at: float | None = None

    @contextlib.contextmanager
    def bound(self, conn: psycopg.Connection[Any], seconds: float) -> Iterator[BoundedCall]:
        """Ends ``conn`` (shuts its socket down) if the block still runs after ``seconds``."""
        call = BoundedCall(conn, time.monotonic() + seconds)
        with self._cond:
            self._calls.add(call)
            if not self._running:
                self._running = True
                _thread.start_new_thread(self._run, ())
            elif self._wakes_at is None or call.deadline < self._wakes_at:
                self._cond.notify()
        try:
            yield call
        finally:
            with self._cond:
                self._calls.discard(call)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for call in [c for c in self._calls if c.deadline <= now]:
                    self._calls.discard(call)
                    call.overran = True
                    _shut_down(call.conn)
                nearest = min((c.deadline for c in self._calls), default=None)
                self._wakes_at = nearest
                self._cond.wait(None if nearest is None else max(0.0, nearest - now))


def _shut_down(conn: psycopg.Connection[Any]) -> None:
    # on a duplicate of the descriptor: the socket is shut down for the call blocked on it,
    # and the descriptor itself stays psycopg's to close
    with contextlib.suppress(Exception):
        duplicate = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()


WATCHDOG = CallWatchdog()
