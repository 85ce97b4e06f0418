"""acquire_many: one round trip for many keys, with the same outcomes and audit as acquire."""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import date, timedelta

import psycopg

from airflow_plugins.lease import Holder, LeaseStore, Outcome
from tests.lease.waiting import wait_for

DAY = date.today()


def _keys(n: int, prefix: str = "tenant_webhooks/send") -> list[str]:
    return [f"{prefix}/{DAY}/t{i:04d}" for i in range(n)]


def test_concurrent_overlapping_batches_grant_each_key_exactly_once(lease_db: str) -> None:
    keys = _keys(1000)
    barrier = threading.Barrier(4)
    granted: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def batch(worker: int) -> None:
        mine = random.Random(worker).sample(keys, 600)
        try:
            with LeaseStore(lease_db, pool_size=1) as store:
                barrier.wait(timeout=30)
                got = store.acquire_many(mine, Holder.process(f"batch-{worker}"), business_date=DAY)
            granted[worker] = [a.key for a in got if a.granted]
            assert len(got) == 600
            assert {a.outcome for a in got} <= {Outcome.GRANTED, Outcome.HELD}
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=batch, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    counts = Counter(k for ks in granted.values() for k in ks)
    assert all(n == 1 for n in counts.values())
    with psycopg.connect(lease_db) as conn:
        audit = conn.execute(
            "SELECT key, count(*) FROM runlease.audit WHERE outcome = 'granted' GROUP BY key"
        ).fetchall()
        leases = conn.execute("SELECT key, holder->>'name' FROM runlease.lease").fetchall()
    assert {str(k): int(n) for k, n in audit} == dict(counts)
    owner = {k: f"batch-{w}" for w, ks in granted.items() for k in ks}
    assert {str(k): str(name) for k, name in leases} == owner


def test_a_batch_for_a_date_past_the_horizon_is_refused_key_by_key(lease_db: str) -> None:
    old = DAY - timedelta(days=500)
    keys = _keys(20)
    with LeaseStore(lease_db, horizon_days=400) as store:
        got = store.acquire_many(keys, Holder.process("backfill"), business_date=old)
        assert [a.outcome for a in got] == [Outcome.REFUSED] * 20
        assert store.list_leases() == []
        assert len(store.audit_by_date(old, outcome="refused")) == 20


def test_a_batch_takes_over_expired_keys_and_regrants_failed_ones(store: LeaseStore) -> None:
    keys = _keys(6)
    failed = store.acquire(keys[0], Holder.process("a")).lease
    store.fail(failed, "tenant API down")
    expired = store.acquire(keys[1], Holder.process("a"), ttl=0.3).lease
    store.complete(store.acquire(keys[2], Holder.process("a")).lease, {"sent": 3})
    live = store.acquire(keys[3], Holder.process("a"), ttl=30).lease
    wait_for(lambda: (store.get(keys[1]) or {}).get("expired"), timeout=10)

    got = {a.key: a for a in store.acquire_many(keys, Holder.process("b"), business_date=DAY)}

    assert got[keys[0]].outcome is Outcome.GRANTED
    assert got[keys[0]].attempt == 2
    assert got[keys[1]].outcome is Outcome.TAKEN_OVER
    assert got[keys[1]].previous_token == expired.token
    assert got[keys[2]].outcome is Outcome.SUCCEEDED
    assert got[keys[2]].result == {"sent": 3}
    assert got[keys[3]].outcome is Outcome.HELD
    assert got[keys[3]].holder == Holder.process("a")
    assert got[keys[3]].token == live.token
    assert [got[k].outcome for k in keys[4:]] == [Outcome.GRANTED] * 2
    tokens = [a.token for a in got.values() if a.granted]
    assert all(t is not None and t > live.token for t in tokens)
    for key in keys:
        assert store.history(key)[-1]["holder"] == Holder.process("b").to_json()


def test_a_batch_grant_of_an_approved_rerun_carries_its_ledger_generation(
    store: LeaseStore,
) -> None:
    # a batch re-run that wrote in generation 0 would skip every item the first run did
    keys = _keys(3, "tenant_webhooks/rerun")
    first = store.acquire_many(keys, Holder.process("first"))
    for got in first:
        store.complete(got.lease, {"sent": 1})
    store.approve_rerun(keys[1], actor="alice", reason="INC-7 resend")
    again = {got.key: got for got in store.acquire_many(keys, Holder.process("rerun"))}
    assert again[keys[1]].granted
    assert again[keys[1]].lease.generation == 1
    assert [again[k].outcome for k in (keys[0], keys[2])] == [Outcome.SUCCEEDED] * 2
