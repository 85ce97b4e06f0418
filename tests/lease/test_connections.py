"""The store's kept connection: threads share the store, broken connections fail closed once,
idle ones are replaced, a renew stays a HOT update (no index holds what it changes), and a
warm-up opens the one connection the next call uses."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from airflow_plugins.lease import (
    Holder,
    LeaseKeeper,
    LeaseStore,
    LeaseStoreUnavailable,
    connections,
)
from tests.conftest import store_backends
from tests.lease.ports import closed_port
from tests.lease.waiting import wait_for

DAY = "2024-02-15"


def _terminate(dsn: str, pids: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_dropped_connection_fails_one_call_closed_and_the_next_reconnects(
    lease_db: str,
) -> None:
    with LeaseStore(lease_db, ttl=5.0) as store:
        holder = Holder.process("conn-test")
        assert store.acquire(f"conn/first/{DAY}", holder).granted
        _terminate(lease_db, wait_for(lambda: store_backends(lease_db)))
        wait_for(lambda: not store_backends(lease_db))

        with pytest.raises(LeaseStoreUnavailable):
            store.acquire(f"conn/second/{DAY}", holder)
        # nothing was written by the call that failed closed
        assert store.get(f"conn/second/{DAY}") is None
        got = store.acquire(f"conn/second/{DAY}", holder)
        assert got.granted
        store.complete(got.lease, {"ok": True})
        assert [r["event"] for r in store.history(f"conn/second/{DAY}")] == [
            "acquire",
            "complete",
        ]


def test_a_connection_idle_past_the_limit_is_replaced_before_use(
    lease_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connections, "KEPT_MAX_IDLE", 0.2)
    with LeaseStore(lease_db, ttl=5.0) as store:
        holder = Holder.process("idle-test")
        store.acquire(f"idle/first/{DAY}", holder)
        # the server drops the idle connection (a restart, a NAT timeout): the store does not
        # hand it out again after the idle limit, so the next call does not fail
        _terminate(lease_db, wait_for(lambda: store_backends(lease_db)))
        wait_for(lambda: not store_backends(lease_db))
        time.sleep(0.3)  # past the (patched) idle limit, which is what this test is about
        assert store.acquire(f"idle/second/{DAY}", holder).granted


@pytest.mark.parametrize("pool_size", [1, 3])
def test_threads_sharing_a_store_each_get_their_own_answers(lease_db: str, pool_size: int) -> None:
    errors: list[BaseException] = []
    with LeaseStore(lease_db, ttl=5.0, pool_size=pool_size) as store:
        kept = store.acquire(f"threads/kept/{DAY}", Holder.process("keeper")).lease

        def work(n: int) -> None:
            holder = Holder.process(f"worker-{n}")
            try:
                for i in range(40):
                    lease = store.acquire(f"threads/w{n}/{DAY}/{i}", holder).lease
                    store.complete(lease, {"worker": n, "i": i})
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        with LeaseKeeper(store, kept, interval=0.05) as keeper:
            workers = [threading.Thread(target=work, args=(n,)) for n in range(3)]
            for t in workers:
                t.start()
            for t in workers:
                t.join(timeout=120)
            wait_for(lambda: keeper.renewals >= 3)
            assert not keeper.lost
        assert errors == []
        for n in range(3):
            for i in (0, 39):
                row = store.get(f"threads/w{n}/{DAY}/{i}")
                assert row is not None
                assert row["state"] == "succeeded"
                assert row["result"] == {"worker": n, "i": i}
                assert row["holder"]["name"] == f"worker-{n}"
    # closed with the store (a backend leaves pg_stat_activity a moment after it is closed)
    wait_for(lambda: not store_backends(lease_db))


def test_a_renew_is_a_hot_update(store: LeaseStore, lease_db: str) -> None:
    lease = store.acquire(f"hot/renew/{DAY}", Holder.process("hot")).lease

    def hot_updates() -> int:
        with psycopg.connect(lease_db, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relid = 'runlease.lease'::regclass"
            ).fetchone()
        assert row is not None
        updates, hot = int(row[0]), int(row[1])
        assert hot == updates, f"{updates - hot} of {updates} updates were not HOT"
        return hot

    for _ in range(5):
        store.renew(lease)
    # the server publishes a session's table statistics within about a second of its use
    wait_for(lambda: hot_updates() >= 5, timeout=60)


def test_warm_up_opens_the_one_connection_and_writes_nothing(lease_db: str) -> None:
    with LeaseStore(lease_db, ttl=5.0) as store:
        store.warm_up()
        warmed = store_backends(lease_db)
        assert len(warmed) == 1
        with psycopg.connect(lease_db, autocommit=True) as conn:
            counts = conn.execute(
                "SELECT (SELECT count(*) FROM runlease.lease), "
                "(SELECT count(*) FROM runlease.audit)"
            ).fetchone()
        assert counts == (0, 0)  # the acquire is only planned; the finish of token 0 matches none

        got = store.acquire(f"warm/first/{DAY}", Holder.process("warm-test"))
        assert got.granted
        store.complete(got.lease, 1)
        assert store_backends(lease_db) == warmed  # the try used the warmed connection


def test_a_call_made_while_warming_waits_for_that_connection(lease_db: str) -> None:
    pool = connections.StoreConnections(lease_db, pool_size=4, connect_timeout=5.0)
    try:
        # a warm-up that takes a while, on a thread of its own as the prewarm runs it: the
        # call below arrives once it has connected, while it still runs
        warming = threading.Thread(
            target=pool.warm, args=([("SELECT pg_sleep(0.5)", {}), ("SELECT 1", {})],)
        )
        warming.start()
        wait_for(lambda: store_backends(lease_db), timeout=10)
        started = time.monotonic()
        with pool.connection() as conn:
            pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
        waited = time.monotonic() - started
        warming.join(timeout=10)
        assert pid is not None
        assert store_backends(lease_db) == [pid["pid"]]  # no second (pooled) connection
        assert waited >= 0.3
    finally:
        pool.close()


def test_a_failed_warm_up_is_quiet_and_the_call_reports_the_store_unreachable() -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{closed_port()}/nowhere"
    with LeaseStore(dsn, ttl=5.0, connect_timeout=1.0) as store:
        store.warm_up()
        with pytest.raises(LeaseStoreUnavailable):
            store.acquire(f"warm/unreachable/{DAY}", Holder.process("warm-test"))


def test_a_long_holders_renewals_prepare_nothing_on_the_server(store: LeaseStore) -> None:
    # behind PgBouncer in transaction mode (before 1.21) a prepared statement lives on one
    # server connection and is missing or duplicated on the next: the sixth renewal failed
    got = store.acquire(f"conn/long/{DAY}", Holder.process("long-holder"), ttl=30)
    for _ in range(12):
        store.renew(got.lease)
    with store.connection() as conn:  # the same kept connection the renewals used
        prepared = conn.execute("SELECT name FROM pg_prepared_statements").fetchall()
    assert prepared == []
    store.complete(got.lease, "done")
