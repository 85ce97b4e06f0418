"""Bad input gets a clear error and changes nothing; an unreachable store fails closed."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from airflow_plugins.lease import (
    LEASE_STORE,
    Holder,
    InvalidLeaseInput,
    LeaseLost,
    LeaseStore,
    LeaseStoreUnavailable,
    Outcome,
    StaleToken,
    advance_fence,
    fenced_transaction,
    migrate,
)
from tests.lease.ports import closed_port

KEY = "billing_nightly/charge/2024-02-15"
HOLDER = Holder.process("bad-input-test")


def _counts(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        leases = conn.execute("SELECT count(*) FROM runlease.lease").fetchone()
        audit = conn.execute("SELECT count(*) FROM runlease.audit").fetchone()
    assert leases is not None
    assert audit is not None
    return int(leases[0]), int(audit[0])


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("k" * 513, "at most 512"),
        ("billing/charge/2024-02-15\x00", "control characters"),
        ("billing/charge\n2024-02-15", "control characters"),
        ("billing/charge/2024-02-15\x1b[31m", "control characters"),
        (12345, "must be a string"),
        (None, "must be a string"),
    ],
)
def test_a_bad_key_is_refused_before_anything_is_written(
    store: LeaseStore, lease_db: str, key: Any, message: str
) -> None:
    with pytest.raises(InvalidLeaseInput, match=message):
        store.acquire(key, HOLDER)
    with pytest.raises(InvalidLeaseInput, match=message):
        store.acquire_many(["ok/key/1", key], HOLDER)
    with pytest.raises(InvalidLeaseInput, match=message):
        store.force_release(key, actor="ops", reason="x")
    with pytest.raises(InvalidLeaseInput, match=message):
        store.record_event(key, "x", outcome="y")
    assert _counts(lease_db) == (0, 0)


def test_the_longest_allowed_key_is_accepted(store: LeaseStore) -> None:
    key = "k" * 512
    assert store.acquire(key, HOLDER).outcome is Outcome.GRANTED
    assert store.get(key) is not None


@pytest.mark.parametrize("ttl", [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, "30", True])
def test_a_bad_ttl_is_refused_and_changes_nothing(
    store: LeaseStore, lease_db: str, ttl: Any
) -> None:
    with pytest.raises(InvalidLeaseInput, match="TTL"):
        store.acquire(KEY, HOLDER, ttl=ttl)
    with pytest.raises(InvalidLeaseInput, match="TTL"):
        LeaseStore(lease_db, ttl=ttl)
    assert _counts(lease_db) == (0, 0)
    lease = store.acquire(KEY, HOLDER, ttl=30).lease
    before = store.get(KEY)
    with pytest.raises(InvalidLeaseInput, match="TTL"):
        store.renew(lease, ttl=ttl)
    assert store.get(KEY) == before


class _Charge:
    """Not JSON."""


@pytest.mark.parametrize(
    "result",
    [
        {"charged": _Charge()},
        {"ids": {1, 2, 3}},
        {"total": math.nan},
        {"total": math.inf},
        b"bytes",
        datetime(2024, 2, 15, tzinfo=UTC),
    ],
)
def test_a_result_that_is_not_json_is_refused_and_the_lease_stays_running(
    store: LeaseStore, lease_db: str, result: Any
) -> None:
    lease = store.acquire(KEY, HOLDER).lease
    counts = _counts(lease_db)

    with pytest.raises(InvalidLeaseInput, match="JSON-serialisable"):
        store.complete(lease, result)

    row = store.get(KEY)
    assert row is not None
    assert row["state"] == "running"
    assert row["result"] is None
    assert _counts(lease_db) == counts
    store.complete(lease, {"charged": 1})
    assert store.acquire(KEY, HOLDER).result == {"charged": 1}


def test_an_oversized_result_is_refused_and_the_lease_stays_running(lease_db: str) -> None:
    with LeaseStore(lease_db, max_result_bytes=10_000) as store:
        lease = store.acquire(KEY, HOLDER).lease
        with pytest.raises(InvalidLeaseInput, match="at most 10000 bytes"):
            store.complete(lease, {"blob": "x" * 10_000})
        row = store.get(KEY)
        assert row is not None
        assert row["state"] == "running"
        assert [r["event"] for r in store.history(KEY)] == ["acquire"]


INJECTIONS = [
    "billing/charge/2024-02-15'; DROP TABLE runlease.lease; --",
    "x' OR '1'='1",
    'x"); DELETE FROM runlease.audit; --',
    "$$; TRUNCATE runlease.lease; $$",
    "%(key)s %s {} \\'",
]


@pytest.mark.parametrize("key", INJECTIONS)
def test_key_text_that_tries_sql_injection_is_stored_literally(
    store: LeaseStore, lease_db: str, key: str
) -> None:
    other = store.acquire("other/task/2024-02-14", HOLDER).lease
    store.complete(other, {"n": 1})
    evil_holder = Holder.process("'); DROP TABLE runlease.audit; --")

    got = store.acquire(key, evil_holder, input={"note": key})
    store.complete(got.lease, {"note": key})

    row = store.get(key)
    assert row is not None
    assert row["key"] == key
    assert row["result"] == {"note": key}
    assert row["holder"]["name"] == "'); DROP TABLE runlease.audit; --"
    assert [r["key"] for r in store.history(key)] == [key, key]
    assert store.acquire(key, HOLDER).outcome is Outcome.SUCCEEDED
    assert store.list_leases(prefix=key)[0]["key"] == key
    assert store.acquire("x", HOLDER).outcome is Outcome.GRANTED  # no prefix match leaked
    # every table is intact, the other key untouched
    assert store.acquire("other/task/2024-02-14", HOLDER).result == {"n": 1}
    assert _counts(lease_db) == (3, 6 + 1)


def test_a_wrong_token_changes_nothing(store: LeaseStore, lease_db: str, sink_db: str) -> None:
    store.acquire("warm/up/2024-02-14", HOLDER)  # so the key's token is not the first
    lease = store.acquire(KEY, HOLDER, ttl=30).lease
    before, counts = store.get(KEY), _counts(lease_db)
    forged = dataclasses.replace(lease, token=lease.token + 1000)
    older = dataclasses.replace(lease, token=lease.token - 1)

    for wrong in (forged, older):
        with pytest.raises(LeaseLost):
            store.complete(wrong, {"charged": 340})
        with pytest.raises(LeaseLost):
            store.fail(wrong, "x")
        with pytest.raises(LeaseLost):
            store.renew(wrong)
    for bad in (0, -5, True):
        with pytest.raises(InvalidLeaseInput, match="positive integer"):
            store.complete(dataclasses.replace(lease, token=bad), {})

    assert store.get(KEY) == before
    assert _counts(lease_db) == counts
    with psycopg.connect(sink_db, autocommit=True) as conn:
        advance_fence(conn, KEY, lease.token)
        with pytest.raises(StaleToken, match=f"token {lease.token} has superseded"):
            with fenced_transaction(conn, KEY, lease.token - 1) as tx:
                tx.claim("customer-1")
        for bad in (0, -1, True):
            with pytest.raises(InvalidLeaseInput):
                with fenced_transaction(conn, KEY, bad):
                    pass
        ledger = conn.execute("SELECT count(*) FROM runfence.ledger").fetchone()
    assert ledger == (0,)


def _run_protected(store: LeaseStore, body: Callable[[], None]) -> None:
    """What a protected task does: the body runs only under a granted lease."""
    got = store.acquire(KEY, HOLDER)
    if got.granted:
        body()
        store.complete(got.lease, {"ok": True})


def test_an_unreachable_store_fails_closed_and_the_body_does_not_run() -> None:
    ran: list[str] = []
    dsn = f"postgresql://postgres@127.0.0.1:{closed_port()}/leases"
    with LeaseStore(dsn, connect_timeout=1.0) as store:
        with pytest.raises(LeaseStoreUnavailable, match="Connection refused"):
            _run_protected(store, lambda: ran.append("charged"))
        with pytest.raises(LeaseStoreUnavailable):
            store.acquire_many([KEY], HOLDER)
        with pytest.raises(LeaseStoreUnavailable):
            store.get(KEY)
    with pytest.raises(LeaseStoreUnavailable):
        migrate(dsn, LEASE_STORE)
    assert ran == []


def test_a_missing_database_fails_closed_too(lease_db: str) -> None:
    ran: list[str] = []
    dsn = psycopg.conninfo.make_conninfo(lease_db, dbname="no_such_database_eo")
    with LeaseStore(dsn, connect_timeout=1.0) as store:
        with pytest.raises(LeaseStoreUnavailable, match="no_such_database_eo"):
            _run_protected(store, lambda: ran.append("charged"))
    assert ran == []
