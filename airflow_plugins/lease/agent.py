"""The lease agent: one long-lived process per host that runs protected tries' lease statements
on connections it keeps open.

Without it every protected try, a new process, opens its own connection to the store: a new
server backend, the largest CPU cost of the plugin on a busy host (docs/benchmarks.md). With
``[exactly_once] agent_socket`` set, a try sends its acquire, renewals and finish to the agent
on a Unix socket instead. It relays, it does not decide: each request is one of the store's own
statements (``wire.AGENT_QUERIES``) in its own transaction, so the database still decides every
outcome and fencing does not depend on the agent; requests are held to the store API's bounds
and to the asking process's own holder (``agent_checks``). ``LeaseAgent`` says how it serves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from airflow_plugins.lease import agent_checks, wire
from airflow_plugins.lease.connection_bounds import bounded_params
from airflow_plugins.lease.connections import unreachable
from airflow_plugins.lease.queries import query
from airflow_plugins.lease.store import DEFAULT_HORIZON_DAYS

log = logging.getLogger(__name__)

# a worker's connection unused for this long is checked (an empty statement) before a request
IDLE_CHECK = 10.0
# a client that has not sent a whole request this long after it connected is dropped
CLIENT_TIMEOUT = 10.0


class LeaseAgent:
    """Serves lease statements on a Unix socket, each worker thread on its own connection.

    Started by ``runlease agent --socket /run/runlease/agent.sock [--dsn ...] [--workers 8]
    [--no-prepare] [--horizon-days 400]``. Each of ``workers`` threads accepts requests on the
    socket and runs them on a connection of its own (made when first needed, checked with an
    empty statement after ``IDLE_CHECK`` seconds unused, so a Postgres restart costs no
    request). A request is refused when it is outside the store API's bounds or names a holder
    that is not the process asking, and dropped when it is not whole within
    ``CLIENT_TIMEOUT``. A try that cannot reach the agent connects itself; a request the agent
    cannot answer is a store outage to the try (it defers), exactly as a dropped connection of
    its own would be. The socket is made ``0600`` (``--mode`` to widen it): whoever can open
    it can take leases, as whoever holds the store's password could.

    Args:
        conninfo: the lease store's libpq connection string or URL.
        socket_path: where to listen.
        workers: requests served at once (and connections to the store, at most).
        prepare: prepare the statements on the server (psycopg does from a statement's fifth
            use). Turn off behind a transaction-mode pooler that cannot keep them (PgBouncer
            before 1.21, or without ``max_prepared_statements``).
        connect_timeout: seconds a worker waits for a new connection to the store before the
            request is answered ``unavailable``.
        mode: the socket file's permissions.
        horizon_days: the widest retention horizon a request may ask for (the store's
            ``horizon_days``; set it to ``[exactly_once] horizon_days``).
    """

    def __init__(
        self,
        conninfo: str,
        socket_path: str | Path,
        *,
        workers: int = 8,
        prepare: bool = True,
        connect_timeout: float = 5.0,
        mode: int = 0o600,
        horizon_days: int = DEFAULT_HORIZON_DAYS,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.identity = wire.store_identity(conninfo)
        self.socket_path = Path(socket_path)
        self.mode = mode
        self.limits = agent_checks.Limits(horizon_days=horizon_days)
        self.workers = workers
        self.served = 0
        self.failed = 0
        self._conninfo = conninfo
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "application_name": "runlease-agent",
            # keepalives, tcp_user_timeout, connect_timeout: a dead route ends the connection
            **bounded_params(conninfo, connect_timeout=connect_timeout),
            "prepare_threshold": 5 if prepare else None,
        }
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._count_lock = threading.Lock()
        self._local = threading.local()

    def start(self) -> None:
        """Starts listening and the worker threads (connections are made when needed).

        Raises:
            RuntimeError: another agent answers on the socket already, or the path is taken.
        """
        self._claim_socket()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            listener.bind(str(self.socket_path))
        finally:
            os.umask(old)
        self.socket_path.chmod(self.mode)
        listener.listen(128)
        self._listener = listener
        for n in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"agent-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info(
            "runlease agent: serving the lease store %s on %s (%d workers)",
            self.identity,
            self.socket_path,
            self.workers,
        )

    def _claim_socket(self) -> None:
        # a socket file left by an agent that died is replaced; a live agent's is not
        path = self.socket_path
        if not path.exists() and not path.is_symlink():
            path.parent.mkdir(parents=True, exist_ok=True)
            return
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise RuntimeError(f"{path} exists and is not a socket; not replacing it")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()
                return
        raise RuntimeError(f"another lease agent answers on {path}")

    def stop(self) -> None:
        """Stops accepting, lets requests in flight finish, removes the socket."""
        listener, self._listener = self._listener, None
        if listener is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the workers blocked in accept
        listener.close()
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads.clear()

    def _work(self) -> None:
        # this worker's connection, kept in a thread-local so that no failure can lose it open
        self._local.conn = None
        self._local.used = 0.0
        try:
            while (listener := self._listener) is not None:
                try:
                    client, _ = listener.accept()
                except OSError:
                    break  # stopped
                with client:
                    self._serve(client)
        finally:
            self._drop_connection()

    def _serve(self, client: socket.socket) -> None:
        """Reads one request from ``client`` and sends its answer."""
        try:
            peer = wire.peer_of(client)
            line = wire.read_line(client, deadline=time.monotonic() + CLIENT_TIMEOUT)
            if line:
                client.settimeout(CLIENT_TIMEOUT)
                client.sendall(self._guarded_answer(line, peer))
        except OSError as exc:
            log.warning("runlease agent: a client went away: %s", exc)

    def _guarded_answer(self, line: bytes, peer: wire.Peer | None = None) -> bytes:
        try:
            return self._answer(line, peer)
        except Exception as exc:  # a bug must not cost the agent a worker
            log.exception("runlease agent: a request failed")
            self._count(failed=True)
            return wire.answer(unavailable=f"the lease agent failed: {exc}")

    def _connection(self) -> psycopg.Connection[Any]:
        """This worker's connection: made when needed, checked after ``IDLE_CHECK`` unused."""
        conn: psycopg.Connection[Any] | None = self._local.conn
        if conn is not None and time.monotonic() - self._local.used > IDLE_CHECK:
            try:
                conn.execute("")
            except psycopg.Error:
                self._drop_connection()
                conn = None
        if conn is None or conn.closed:
            conn = self._local.conn = psycopg.connect(self._conninfo, **self._connect_kwargs)
        self._local.used = time.monotonic()
        return conn

    def _drop_connection(self) -> None:
        conn, self._local.conn = self._local.conn, None
        if conn is not None:
            conn.close()

    def _answer(self, line: bytes, peer: wire.Peer | None) -> bytes:
        try:
            body = json.loads(line)
            store, name = body["store"], body.get("query")
            if store != self.identity:
                return wire.answer(refused=f"this agent serves {self.identity}, not {store}")
            if body.get("ping"):
                return wire.answer(store=self.identity, served=self.served, failed=self.failed)
            if name not in wire.AGENT_QUERIES:
                return wire.answer(refused=f"not a statement this agent runs: {name!r}")
            params = wire.decode_params(body["params"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return wire.answer(refused=f"not a lease agent request: {exc}")
        try:
            params = agent_checks.checked(name, params, self.limits, peer)
        except agent_checks.RequestRefused as exc:
            log.warning(
                "runlease agent: refused a %s from pid %s: %s", name, peer and peer.pid, exc
            )
            return wire.answer(refused=str(exc))
        try:
            conn = self._connection()
            with conn.cursor(row_factory=tuple_row) as cursor:
                rows = cursor.execute(query(name), params).fetchall()
        except psycopg.Error as exc:
            self._count(failed=True)
            current = self._local.conn
            if current is not None and (current.broken or current.closed):
                self._drop_connection()
            if unreachable(exc):
                return wire.answer(unavailable=str(exc).strip())
            return wire.answer(error=str(exc), sqlstate=exc.sqlstate)
        answer = wire.rows_answer(rows)
        self._count(failed=False)
        return answer

    def _count(self, *, failed: bool) -> None:
        with self._count_lock:
            if failed:
                self.failed += 1
            else:
                self.served += 1


def run(conninfo: str, socket_path: str, **options: Any) -> int:
    """Runs an agent in this process until SIGTERM or SIGINT; returns the exit code."""
    agent = LeaseAgent(conninfo, socket_path, **options)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        agent.start()
    except (RuntimeError, OSError) as exc:
        log.error("runlease agent: %s", exc)
        return 1
    stopping.wait()
    log.info("runlease agent: stopping (%d served, %d failed)", agent.served, agent.failed)
    agent.stop()
    return 0
