"""A shadow attempt that completed its lease but whose result never reached Temporal (the worker
died, or the answer was lost) is retried: the retry finds the shadow lease succeeded and must
hand the comparison what the shadow captured, not an empty capture that reads as "the shadow
would have charged nobody" and makes a false mismatch (issue 22's bridge campaign found it).

Runs ``bridge.run_task`` twice in temporalio's ``ActivityEnvironment`` (Temporal's retry is the
boundary, not what is tested) on the real lease store and sink: the first attempt's result is
thrown away, as a lost answer is; the second is what the workflow compares.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
import pytest
from temporalio.testing import ActivityEnvironment

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.external_call import CallAnswer, OutgoingCall
from airflow_plugins.lease.fence import Fence
from bridge.cutover import ModeStore
from bridge.spec import RunMode, TaskInput, TaskResult, TaskSpec
from bridge.worker.activities import BridgeActivities
from bridge.worker.catalog import TaskCatalog
from tests.airflow.conftest import conn_uri

DAG_ID = "billing_shadow_retry"
DATE = "2024-02-15"
CUSTOMERS = [f"cust-{i}" for i in range(5)]
AT_PROCESSOR = [f"card-{i}" for i in range(3)]


def _never_sent(call: OutgoingCall) -> CallAnswer:
    raise AssertionError(f"a shadow sent {call.item}")


def billing(fence: Fence) -> dict[str, int]:
    """Writes each customer's charge row in a fenced transaction, and charges three more at the
    processor through the fence's external call (a shadow records them, never sends)."""
    for customer in CUSTOMERS:
        with fence.transaction() as tx:
            if tx.claim(customer):
                tx.conn.execute(
                    "INSERT INTO charges (run_key, customer, token) VALUES (%s, %s, %s)",
                    (fence.primary_key, customer, fence.token),
                )
    for item in AT_PROCESSOR:
        fence.external_call(item, {"amount": 100, "currency": "usd"}, _never_sent)
    return {"charged": len(CUSTOMERS) + len(AT_PROCESSOR)}


def _run(activities: BridgeActivities, inp: TaskInput, attempt: int) -> TaskResult:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    result: TaskResult = env.run(activities.run_task, inp)
    return result


def _rows(sink: str) -> int:
    with psycopg.connect(sink) as conn:
        row = conn.execute("SELECT count(*) FROM charges").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("mapped", [False, True], ids=["task", "mapped-item"])
def test_a_retried_shadow_hands_the_comparison_what_its_first_attempt_captured(
    mapped: bool, lease_db: str, sink_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SINK", conn_uri(sink_db))
    catalog = TaskCatalog()
    catalog.register(DAG_ID, "charge", billing)
    spec = TaskSpec(task_id="charge", fenced=True, sink="sink", heartbeat_s=0.6, lease_ttl_s=10)
    extra: dict[str, Any] = {"map_key": "tenant-a"} if mapped else {}
    inp = TaskInput(dag_id=DAG_ID, business_date=DATE, task=spec, mode=RunMode.SHADOW, **extra)
    with LeaseStore(lease_db, horizon_days=4000) as store:
        activities = BridgeActivities(store, catalog, ModeStore(store))
        first = _run(activities, inp, attempt=1)  # its answer is lost on the way to Temporal
        retried = _run(activities, inp, attempt=2)
    assert first.status == "succeeded"
    assert first.captured["items"] == sorted(CUSTOMERS + AT_PROCESSOR)
    assert [c["item"] for c in first.captured["calls"]] == AT_PROCESSOR
    assert len(first.captured["rows"]["public.charges"]) == len(CUSTOMERS)
    # the retry does not run the body again, and reports what the shadow would have done
    assert retried.status == "recorded"
    assert retried.result == first.result == {"charged": 8}
    # what the comparison compares survives (the rows, only shown, are not kept)
    assert retried.captured == {
        "items": first.captured["items"],
        "calls": first.captured["calls"],
        "rows_omitted": True,
    }
    assert _rows(sink_db) == 0  # a shadow leaves the sink as it was


def test_a_shadow_record_keeps_what_is_compared_and_never_fails_for_its_size() -> None:
    """The record keeps the items and calls (what the comparison compares), never the sink
    rows (shown, not compared); one that would not fit the store's result limit is the plain
    result, so the shadow is recorded as before rather than failed."""
    from bridge.worker.shadow_record import decode, encode

    capture: dict[str, Any] = {"items": ["a", "b"], "rows": {"public.charges": [{"n": 1}]}}
    capture["calls"] = [{"item": "b", "idempotency_key": "k", "params": {"amount": 1}}]
    result, got = decode(encode({"charged": 2}, capture, max_bytes=1_000_000))
    assert result == {"charged": 2}
    assert got == {"items": ["a", "b"], "calls": capture["calls"], "rows_omitted": True}
    many = {"items": [f"c-{i}" for i in range(100)], "calls": capture["calls"] * 100}
    assert decode(encode({"charged": 100}, many, max_bytes=2_000)) == ({"charged": 100}, {})
    assert decode({"charged": 2}) == ({"charged": 2}, {})  # recorded before this format
