"""The audit trail, administrative changes and audit retention, on the real lease store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import date, timedelta

import psycopg
import pytest

from airflow_plugins.lease import Holder, InvalidLeaseInput, LeaseStore, Outcome
from airflow_plugins.lease.keys import lease_key
from tests.lease.waiting import wait_for

DAY = date(2024, 2, 15)
KEY = str(lease_key("billing_nightly", "charge", DAY.isoformat()))
SECRET = "hunter2-very-secret"


def _holder(try_number: int) -> Holder:
    return Holder.airflow(
        dag_id="billing_nightly",
        run_id="scheduled__2024-02-15",
        task_id="charge",
        try_number=try_number,
    )


@pytest.fixture
def long_store(lease_db: str) -> Iterator[LeaseStore]:
    """A store whose horizon reaches back to 2024 (the tests use that business date)."""
    store = LeaseStore(lease_db, ttl=5.0, horizon_days=36500)
    yield store
    store.close()


def test_every_transition_is_audited_with_who_what_and_how_long(
    long_store: LeaseStore, lease_db: str
) -> None:
    store = long_store
    given = {
        "customers": 340,
        "processor": {"api_key": SECRET},
        "dsn": f"postgresql://u:{SECRET}@db/x",
    }
    first = store.acquire(KEY, _holder(1), ttl=0.3, business_date=DAY, input=given)
    store.acquire(KEY, _holder(9), business_date=DAY, input=given)  # held
    wait_for(lambda: (store.get(KEY) or {}).get("expired"), timeout=10)
    second = store.acquire(KEY, _holder(2), ttl=30, business_date=DAY, input=given)
    time.sleep(0.05)
    store.complete(second.lease, {"charged": 340, "password": SECRET})
    store.acquire(KEY, _holder(3), business_date=DAY, input=given)  # succeeded

    rows = store.history(KEY)

    assert [(r["event"], r["outcome"]) for r in rows] == [
        ("acquire", "granted"),
        ("acquire", "held"),
        ("acquire", "taken_over"),
        ("complete", "succeeded"),
        ("acquire", "succeeded"),
    ]
    granted, held, taken, done, skipped = rows
    assert all(r["key"] == KEY and r["business_date"] == DAY for r in rows)
    assert (granted["token"], granted["attempt"], granted["holder"]) == (
        first.token,
        1,
        _holder(1).to_json(),
    )
    assert held["holder"] == _holder(9).to_json()
    assert "held until" in held["reason"]
    assert (taken["token"], taken["attempt"]) == (second.token, 2)
    assert taken["input"]["customers"] == 340
    assert taken["input"]["processor"] == {"api_key": "***"}
    assert taken["input"]["dsn"] == "***"  # a name Airflow masks whole
    assert (done["token"], done["holder"]) == (second.token, _holder(2).to_json())
    assert done["output"] == {"charged": 340, "password": "***"}
    assert done["duration_ms"] >= 50
    assert skipped["holder"] == _holder(3).to_json()
    assert rows[0]["at"] < rows[-1]["at"]
    with psycopg.connect(lease_db) as conn:
        leaked = conn.execute(
            "SELECT count(*) FROM runlease.audit a WHERE a::text LIKE %s", (f"%{SECRET}%",)
        ).fetchone()
    assert leaked == (0,)


def test_an_oversized_input_is_recorded_as_a_digest(lease_db: str) -> None:
    with LeaseStore(lease_db, max_audit_bytes=1024) as store:
        store.acquire(KEY, _holder(1), input={"rows": ["x" * 100] * 100})
        (row,) = store.history(KEY)
    assert row["input"]["_truncated"] is True
    assert row["input"]["bytes"] > 10_000
    assert len(row["input"]["sha256"]) == 64


def test_the_audit_is_queryable_by_business_date_and_prefix(long_store: LeaseStore) -> None:
    store = long_store
    other_day = DAY + timedelta(days=1)
    for dag in ("billing_nightly", "soc2_backup"):
        for day in (DAY, other_day):
            key = str(lease_key(dag, "run", day.isoformat()))
            store.complete(store.acquire(key, _holder(1), business_date=day).lease, {"ok": 1})

    rows = store.audit_by_date(DAY)
    billing = store.audit_by_date(DAY, prefix="billing_nightly/")
    completes = store.audit_by_date(DAY, outcome="succeeded")

    assert {r["key"] for r in rows} == {
        "billing_nightly/run/2024-02-15",
        "soc2_backup/run/2024-02-15",
    }
    assert len(rows) == 4
    assert {(r["key"], r["event"]) for r in billing} == {
        ("billing_nightly/run/2024-02-15", "acquire"),
        ("billing_nightly/run/2024-02-15", "complete"),
    }
    assert len(completes) == 2
    assert all(r["event"] == "complete" for r in completes)


def test_force_release_needs_actor_and_reason_and_records_them(store: LeaseStore) -> None:
    lease = store.acquire(KEY, _holder(1), ttl=30).lease
    for actor, reason in (("", "stuck"), ("ops", ""), ("  ", "  ")):
        with pytest.raises(InvalidLeaseInput, match="actor and a reason"):
            store.force_release(KEY, actor=actor, reason=reason)
    assert store.get(KEY)["state"] == "running"  # type: ignore[index]

    assert store.force_release(KEY, actor="bob@platform", reason="worker node lost") == lease.token

    row = store.get(KEY)
    assert row is not None
    assert row["state"] == "released"
    audit = store.history(KEY)[-1]
    assert (audit["event"], audit["outcome"], audit["actor"], audit["reason"], audit["token"]) == (
        "force_release",
        "released",
        "bob@platform",
        "worker node lost",
        lease.token,
    )
    again = store.acquire(KEY, _holder(2))
    assert again.outcome is Outcome.GRANTED
    assert again.token is not None
    assert again.token > lease.token
    # nothing running: nothing to release, nothing audited
    n = len(store.history(KEY))
    store.complete(again.lease)
    assert store.force_release(KEY, actor="bob", reason="again") is None
    assert len(store.history(KEY)) == n + 1


def test_fail_on_behalf_fails_only_the_named_try_and_records_who(store: LeaseStore) -> None:
    lease = store.acquire(KEY, _holder(2), ttl=30).lease
    with pytest.raises(InvalidLeaseInput):
        store.fail_on_behalf(KEY, {"try_number": 2}, actor="listener", reason="")

    assert (
        store.fail_on_behalf(KEY, {"try_number": 1}, actor="listener", reason="try 1 failed")
        is None
    )
    assert store.get(KEY)["state"] == "running"  # type: ignore[index]

    token = store.fail_on_behalf(
        KEY,
        {"run_id": "scheduled__2024-02-15", "try_number": 2},
        actor="airflow-listener",
        reason="task instance failed: OOMKilled",
    )
    assert token == lease.token
    row = store.get(KEY)
    assert row is not None
    assert row["state"] == "failed"
    audit = store.history(KEY)[-1]
    assert (audit["event"], audit["actor"], audit["reason"], audit["outcome"]) == (
        "fail_on_behalf",
        "airflow-listener",
        "task instance failed: OOMKilled",
        "failed",
    )
    assert audit["duration_ms"] >= 0


def test_approve_rerun_needs_a_reason_and_refuses_a_running_lease(store: LeaseStore) -> None:
    lease = store.acquire(KEY, _holder(1), ttl=30).lease
    with pytest.raises(InvalidLeaseInput, match="actor and a reason"):
        store.approve_rerun(KEY, actor="alice", reason=" ")
    with pytest.raises(InvalidLeaseInput, match="force-release it first"):
        store.approve_rerun(KEY, actor="alice", reason="re-bill")
    store.fail(lease, "boom")
    assert store.approve_rerun(KEY, actor="alice", reason="re-bill") == "not_needed"
    assert not [r for r in store.history(KEY) if r["event"] == "approve_rerun"]


def test_record_event_writes_an_audit_row_that_is_not_a_transition(store: LeaseStore) -> None:
    store.record_event(
        KEY,
        "duplicate_run",
        outcome="blocked",
        holder=_holder(1),
        input={"password": SECRET, "run_id": "manual__x"},
        actor="listener",
        reason="second run of the same business date",
    )
    (row,) = store.history(KEY)
    assert (row["event"], row["outcome"], row["input"]) == (
        "duplicate_run",
        "blocked",
        {"password": "***", "run_id": "manual__x"},
    )
    assert store.get(KEY) is None


def _partition_of(conn: psycopg.Connection[tuple[object, ...]], key: str) -> list[str]:
    rows = conn.execute(
        "SELECT tableoid::regclass::text FROM runlease.audit WHERE key = %s ORDER BY id", (key,)
    ).fetchall()
    return [str(r[0]) for r in rows]


def test_audit_partitions_take_in_default_rows_and_old_months_are_dropped(
    store: LeaseStore, lease_db: str
) -> None:
    with psycopg.connect(lease_db, autocommit=True) as conn:
        # rows written while their month had no partition land in the default partition
        conn.execute(
            "INSERT INTO runlease.audit (at, key, event, outcome) VALUES "
            "('2020-01-15', 'old/a/2020-01-15', 'acquire', 'granted'), "
            "('2020-01-20', 'old/a/2020-01-15', 'complete', 'succeeded'), "
            "('2020-03-02', 'old/b/2020-03-02', 'acquire', 'granted')"
        )
        assert _partition_of(conn, "old/a/2020-01-15") == ["runlease.audit_default"] * 2

        assert store.ensure_audit_partitions(date(2020, 1, 1), date(2020, 3, 1)) == 3
        assert store.ensure_audit_partitions(date(2020, 1, 1), date(2020, 3, 1)) == 0

        assert _partition_of(conn, "old/a/2020-01-15") == ["runlease.audit_2020_01"] * 2
        assert _partition_of(conn, "old/b/2020-03-02") == ["runlease.audit_2020_03"]
        assert [r["event"] for r in store.history("old/a/2020-01-15")] == ["acquire", "complete"]
        store.acquire(KEY, _holder(1))

        dropped, _ = store.prune(audit_keep_months=2)

        assert dropped == 3
        assert store.history("old/a/2020-01-15") == []
        assert store.history("old/b/2020-03-02") == []
        assert [r["outcome"] for r in store.history(KEY)] == ["granted"]
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'runlease.audit'::regclass"
            ).fetchall()
        }
    assert not {"audit_2020_01", "audit_2020_02", "audit_2020_03"} & tables
    assert "audit_default" in tables
    assert f"audit_{date.today():%Y_%m}" in tables
