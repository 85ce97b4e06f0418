"""The lease store's connections: one kept for the hot path, a small pool for the rest.

A lease call on the kept connection skips the pool checkout; a call made while another thread
has it is served from the pool, except while ``warm`` opens it (the call then waits for it
rather than starting a second connection). Every call is bounded in time (``connection_bounds``,
``call_watchdog``), failures to reach Postgres fail closed as ``LeaseStoreUnavailable``, and no
statement is prepared on the server (``StoreConnections`` says why).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from airflow_plugins.lease.call_watchdog import WATCHDOG
from airflow_plugins.lease.connection_bounds import bounded_params
from airflow_plugins.lease.errors import LeaseStoreUnavailable

log = logging.getLogger(__name__)

# The kept connection is replaced after this long unused, as a pool retires idle connections:
# a connection idle for hours (a Postgres restart, a NAT timeout meanwhile) would otherwise
# cost the next call a failure.
KEPT_MAX_IDLE = 60.0
_IDLE = psycopg.pq.TransactionStatus.IDLE
# a store call not answered in this long fails as unavailable (its connection is ended)
DEFAULT_CALL_TIMEOUT = 30.0


def unreachable(exc: psycopg.Error) -> bool:
    """Whether a psycopg error means the store could not be reached or dropped the connection
    (fail closed, try again later), rather than an answer from the database.

    SQLSTATE class 55 is an ``OperationalError`` in psycopg, but ``ObjectInUse`` is an answer
    (``approve_rerun`` of a running lease), not an unreachable store.
    """
    return isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, psycopg.errors.ObjectInUse
    )


class StoreConnections:
    """Autocommit connections with dict rows to one lease-store database.

    Every call is bounded in time: TCP keepalives, ``tcp_user_timeout`` and ``connect_timeout``
    (``connection_bounds``) end a connection whose peer vanished, and a call still running
    after ``call_timeout`` (or the caller's shorter bound) has its connection ended by the
    ``call_watchdog``, for a route that acknowledges packets and never answers.

    No statement is prepared on the server (``prepare_threshold=None``): psycopg would prepare
    a query from its fifth use on a connection, and behind PgBouncer in transaction mode
    (before 1.21, or without ``max_prepared_statements``) a long task's sixth renewal then
    failed with ``prepared statement "_pg3_0" already exists`` (seen with Debian's PgBouncer
    1.18). A task process runs each statement a few times, so preparing saved it nothing.

    Args:
        conninfo: a libpq connection string or URL.
        pool_size: most connections open at once: the kept one and ``pool_size - 1`` pooled.
        connect_timeout: seconds to wait for a connection before failing closed.
        call_timeout: seconds a call may wait for its answer before its connection is ended
            and it fails closed (a caller may ask for a shorter bound).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int,
        connect_timeout: float,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._call_timeout = call_timeout
        self._conninfo = conninfo
        self._bounds = bounded_params(conninfo, connect_timeout=connect_timeout)
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            **self._bounds,
            "application_name": "runlease",
            "prepare_threshold": None,  # safe behind any transaction-mode pooler
        }
        self._kept: psycopg.Connection[dict[str, Any]] | None = None
        self._kept_used = 0.0
        self._kept_lock = threading.Lock()
        self._warming = threading.Event()
        self._pool_size = pool_size
        # made on first use: a short try never needs it, and making it costs CPU in the try
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_lock = threading.Lock()

    @contextmanager
    def connection(
        self, timeout: float | None = None
    ) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """The kept connection when it is free, else a pooled one.

        With ``pool_size=1`` there is no pool: the call waits for the kept connection.

        Args:
            timeout: seconds the block may wait on the connection (default ``call_timeout``);
                past it the connection is ended and the call fails closed.

        Raises:
            LeaseStoreUnavailable: Postgres could not be reached, dropped the connection or
                did not answer in time.
        """
        bound = self._call_timeout if timeout is None else timeout
        try:
            if self._pool_size <= 1:
                if not self._kept_lock.acquire(timeout=self._connect_timeout):
                    raise LeaseStoreUnavailable(
                        "lease store unavailable: its one connection stayed busy for "
                        f"{self._connect_timeout} s"
                    )
                kept = True
            else:
                kept = self._kept_lock.acquire(blocking=False) or (
                    # being opened by warm(): waiting for it beats opening a second one
                    self._warming.is_set()
                    and self._kept_lock.acquire(timeout=self._connect_timeout)
                )
            if kept:
                try:
                    yield from self._kept_connection(bound)
                finally:
                    self._kept_lock.release()
            else:
                yield from self._pooled_connection(bound)
        except psycopg_pool.PoolTimeout as exc:
            raise LeaseStoreUnavailable(
                f"lease store unavailable: {exc}: {self._why_no_connection()}"
            ) from exc
        except psycopg.OperationalError as exc:
            if not unreachable(exc):
                raise
            raise LeaseStoreUnavailable(f"lease store unavailable: {exc}") from exc

    def warm(self, statements: Sequence[tuple[str, Mapping[str, Any]]]) -> bool:
        """Opens the kept connection and runs ``statements`` on it, in the calling thread.

        Meant for statements that write nothing but load what the hot ones need (the server's
        catalog caches, psycopg's query and type caches), run on a thread of its own before
        the real calls come. Calls made meanwhile from other threads wait for this connection
        instead of opening another. A failure is only logged: the first real call then
        connects itself and reports it.

        Returns:
            whether the statements ran (False: the store failed, or a real call had the
            connection first).
        """
        self._warming.set()
        return self._warm(statements)

    def _warm(self, statements: Sequence[tuple[str, Mapping[str, Any]]]) -> bool:
        try:
            if not self._kept_lock.acquire(blocking=False):
                return False  # a real call got there first and opens it itself
            try:
                with contextmanager(self._kept_connection)(self._call_timeout) as conn:
                    for sql, params in statements:
                        conn.execute(sql, params)
                return True
            finally:
                self._kept_lock.release()
        except psycopg.Error as exc:
            log.info("warming the lease store's connection failed: %s", exc)
            return False
        finally:
            self._warming.clear()

    def _kept_connection(self, bound: float) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        # called with _kept_lock held
        conn = self._kept
        now = time.monotonic()
        if conn is not None and now - self._kept_used > KEPT_MAX_IDLE:
            self._kept = None
            conn.close()
            conn = None
        if conn is None or conn.closed:
            conn = self._kept = psycopg.connect(
                self._conninfo, row_factory=dict_row, **self._connect_kwargs
            )
        conn.row_factory = dict_row  # as handed out before, whatever a caller set meanwhile
        try:
            yield from _bounded(conn, bound)
        finally:
            self._kept_used = time.monotonic()
            # as the pool does: a connection that broke, or that a caller left inside a
            # transaction, is not handed out again
            if conn.broken or conn.closed or conn.info.transaction_status != _IDLE:
                self._kept = None
                conn.close()

    def _pooled_connection(self, bound: float) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        with self._pool_lock:
            if self._pool is None:
                self._pool = psycopg_pool.ConnectionPool(
                    self._conninfo,
                    min_size=0,
                    max_size=self._pool_size - 1,
                    open=False,
                    timeout=self._connect_timeout,
                    kwargs=self._connect_kwargs,
                    reconnect_timeout=0,
                )
                self._pool.open(wait=False)
            pool = self._pool
        with pool.connection() as conn:
            conn.row_factory = dict_row
            yield from _bounded(conn, bound)

    def _why_no_connection(self) -> str:
        # the pool only says it timed out; one direct attempt tells the operator why
        try:
            with psycopg.connect(self._conninfo, **self._bounds):
                return f"all {self.pool_connections} pooled connections are busy"
        except psycopg.Error as exc:
            return str(exc).strip()

    @property
    def pool_connections(self) -> int:
        """How many connections the pool may open besides the kept one."""
        return max(0, self._pool_size - 1)

    def close(self) -> None:
        """Closes every connection."""
        with self._kept_lock:
            if self._kept is not None:
                self._kept.close()
                self._kept = None
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def _bounded(
    conn: psycopg.Connection[dict[str, Any]], seconds: float
) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with WATCHDOG.bound(conn, seconds) as call:
        try:
            yield conn
        except psycopg.OperationalError as exc:
            if call.overran:
                raise LeaseStoreUnavailable(
                    f"lease store unavailable: no answer within {seconds:.3g} s "
                    "(the connection was ended)"
                ) from exc
            raise
