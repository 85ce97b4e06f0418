"""A holder frozen inside a statement of its fenced transaction (SIGSTOP mid-COPY).

The sink lives on a private server (the frozen holder blocks a row there, and is ended). The
old holder is a real process that stops itself in the middle of ``COPY FROM STDIN``; the new
holder, granted after the old lease expired, must get through the fence while the old one is
still frozen, and the old one's commit must fail when it wakes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres
from airflow_plugins.lease import (
    SINK_FENCE,
    Holder,
    LeaseStore,
    Outcome,
    fenced_transaction,
    migrate,
)
from tests.lease.ports import free_port
from tests.lease.waiting import wait_for

WORKER = Path(__file__).with_name("frozen_copy_worker.py")
KEY = "billing_nightly/charge/2024-02-15"
CUSTOMERS = 20


@pytest.fixture(scope="module")
def private_sink() -> Iterator[str]:
    """A sink database (fence migrated, a ``charges`` table) on a private server."""
    port = free_port()
    datadir = Path(tempfile.gettempdir()) / f"eo-frozen-test-{port}-{uuid.uuid4().hex[:8]}"
    server = EmbeddedPostgres(port, datadir=datadir)
    server.start()
    try:
        dsn = server.create_database("billing")
        migrate(dsn, SINK_FENCE)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE charges (id bigserial PRIMARY KEY, run_key text NOT NULL, "
                "customer text NOT NULL, token bigint, writer text)"
            )
        yield dsn
    finally:
        server.destroy()


def _status(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def test_a_holder_frozen_mid_copy_neither_blocks_the_new_holder_nor_commits(
    store: LeaseStore, private_sink: str
) -> None:
    customers = [f"customer-{i:03d}" for i in range(CUSTOMERS)]
    old = store.acquire(KEY, Holder.process("frozen"), ttl=1.0).lease
    out = tempfile.TemporaryFile(mode="w+")
    frozen = subprocess.Popen(
        [
            sys.executable, str(WORKER),
            "--sink-dsn", private_sink,
            "--key", KEY,
            "--token", str(old.token),
            "--customers", str(CUSTOMERS),
        ],
        stdout=out,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    events: list[str] = []
    done = threading.Event()

    def new_holder(token: int) -> None:
        try:
            with (
                psycopg.connect(private_sink, autocommit=True) as conn,
                fenced_transaction(conn, KEY, token) as tx,
            ):
                for customer in tx.claim_many(customers):
                    conn.execute(
                        "INSERT INTO charges (run_key, customer, token, writer) "
                        "VALUES (%s, %s, %s, 'new')",
                        (KEY, customer, token),
                    )
            events.append(f"new holder committed, old holder {_status(frozen.pid)}")
        except psycopg.Error as exc:
            events.append(f"new holder failed: {exc}")
        finally:
            done.set()

    thread = None
    try:
        wait_for(lambda: _status(frozen.pid) == "stopped", timeout=60)
        out.seek(0)
        assert out.read().strip() == "copying"
        wait_for(lambda: (store.get(KEY) or {}).get("expired"), timeout=30)
        new = store.acquire(KEY, Holder.process("new"), ttl=60)
        assert new.outcome is Outcome.TAKEN_OVER
        assert new.token is not None
        thread = threading.Thread(target=new_holder, args=(new.token,), daemon=True)
        thread.start()
        # bounded: the new holder gets through while the old one is still frozen
        wait_for(done.is_set, timeout=30)
    finally:
        if _status(frozen.pid) != "gone":
            frozen.send_signal(signal.SIGCONT)
        frozen.wait(timeout=60)
        if thread is not None:
            thread.join(timeout=60)
    out.seek(0)
    said = out.read().split("\n")
    out.close()
    assert events == ["new holder committed, old holder stopped"]
    assert said[0] == "copying"
    assert said[1].startswith("failed: ")  # the old commit did not go through
    assert frozen.returncode == 1
    with psycopg.connect(private_sink) as conn:
        rows = conn.execute(
            "SELECT customer, token, writer FROM charges ORDER BY customer"
        ).fetchall()
        ledger = conn.execute(
            "SELECT DISTINCT token FROM runfence.ledger WHERE key = %s", (KEY,)
        ).fetchall()
    assert [r[0] for r in rows] == customers  # every customer charged, each once
    assert {(r[1], r[2]) for r in rows} == {(new.token, "new")}
    assert ledger == [(new.token,)]


def test_the_holders_own_second_transaction_waits_and_is_not_ended(private_sink: str) -> None:
    # two transactions of one holder (one token, e.g. two threads of one body) queue on the
    # fence row as before: neither is ended, nor refused as busy
    key = f"{KEY}/own-{uuid.uuid4().hex[:8]}"
    order: list[str] = []
    with (
        psycopg.connect(private_sink, autocommit=True) as first,
        psycopg.connect(private_sink, autocommit=True) as second,
    ):
        second_started = threading.Event()

        def later() -> None:
            second_started.set()
            with fenced_transaction(second, key, 7, lock_timeout=0.2):
                order.append("second committed")

        with fenced_transaction(first, key, 7, lock_timeout=0.2) as tx:
            assert tx.claim("customer-000")
            thread = threading.Thread(target=later, daemon=True)
            thread.start()
            assert second_started.wait(timeout=30)
            # the second waits past several of its lock timeouts
            first_wait = wait_for(lambda: _lock_waits(private_sink), timeout=30)
            wait_for(lambda: _lock_waits(private_sink) - first_wait, timeout=30)
            order.append("first committing")
        thread.join(timeout=60)
        assert not first.closed
    assert order == ["first committing", "second committed"]


def _lock_waits(dsn: str) -> set[str]:
    """The start times of the statements now waiting on a lock (a retried advance is a new
    statement, with a later start)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query_start::text FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchall()
    return {str(r[0]) for r in rows}
