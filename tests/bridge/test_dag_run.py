"""The DAG-run workflow on the real Temporal dev server and Postgres."""

from __future__ import annotations

import asyncio
import uuid
from datetime import date, timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError

from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.lease.keys import lease_key
from bridge.config import BridgeConfig
from bridge.identity import workflow_id
from bridge.spec import UPSTREAM_MARKER, DagSpec, RetrySpec, TaskSpec
from bridge.temporal.handover import Handover, run_handle
from tests.bridge.conftest import per_customer, running_worker

W = "tests.bridge.workloads"
BD = (date.today() - timedelta(days=1)).isoformat()


def billing_spec(dag_id: str, count: int = 20, delay: float = 0.0) -> DagSpec:
    """extract -> (charge, audit in parallel) -> report."""
    return DagSpec(
        dag_id=dag_id,
        tasks=(
            TaskSpec(
                "extract", callable_ref=f"{W}:customers", args=(count,), side_effect_free=True
            ),
            TaskSpec(
                "charge",
                upstream=("extract",),
                callable_ref=f"{W}:charge_all",
                kwargs={"customers": {UPSTREAM_MARKER: "extract"}, "delay": delay},
                fenced=True,
                sink="billing_db",
                heartbeat_s=5,
                lease_ttl_s=3,
                retry=RetrySpec(initial_interval_s=0.2),
            ),
            TaskSpec("audit", upstream=("extract",), callable_ref="builtins:len",
                     args=([1, 2],), side_effect_free=True),
            TaskSpec("report", upstream=("charge", "audit"), callable_ref="builtins:dict",
                     kwargs={"charge": {UPSTREAM_MARKER: "charge"}}, side_effect_free=True),
        ),
    )  # fmt: skip


def new_dag() -> str:
    return f"billing_{uuid.uuid4().hex[:8]}"


async def history_events(client, wid: str) -> list:  # type: ignore[no-untyped-def]
    history = await client.get_workflow_handle(wid).fetch_history()
    return list(history.events)


def test_run_keeps_dependencies_and_charges_each_customer_once(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    dag_id = new_dag()
    spec = billing_spec(dag_id)

    async def scenario() -> object:
        async with running_worker(config, lease_store) as client:
            handover = Handover(client, config.task_queue("default"), store=lease_store)
            got = await handover.start_or_attach(spec, BD)
            assert got.started
            return await run_handle(client, got.workflow_id).result()

    result = asyncio.run(scenario())
    assert result.status == "success"  # type: ignore[attr-defined]
    assert result.tasks["report"].result == {"charge": {"charged": 20, "cents": 2000}}  # type: ignore[attr-defined]
    assert per_customer(sink) == {f"cust-{n:04d}": 1 for n in range(20)}
    key = str(lease_key(dag_id, "charge", BD))
    row = lease_store.get(key)
    assert row is not None
    assert row["state"] == "succeeded"
    assert row["holder"]["engine"] == "temporal"
    run_row = lease_store.get(f"{dag_id}/dagrun/{BD}")
    assert run_row is not None
    assert run_row["state"] == "succeeded"


def test_duplicate_handover_starts_no_second_execution(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    dag_id = new_dag()
    spec = billing_spec(dag_id, count=10, delay=0.1)

    async def scenario() -> tuple[list[bool], int, object, object]:
        async with running_worker(config, lease_store) as client:
            handover = Handover(client, config.task_queue("default"), store=None)
            first = await asyncio.gather(*(handover.start_or_attach(spec, BD) for _ in range(5)))
            wid = first[0].workflow_id
            done = await run_handle(client, wid).result()
            again = await handover.start_or_attach(spec, BD)
            runs = [w async for w in client.list_workflows(f'WorkflowId = "{wid}"')]
            return [h.started for h in first], len(runs), again, done

    started, executions, again, _done = asyncio.run(scenario())
    assert started.count(True) == 1, started
    assert executions == 1
    assert again.started is False  # type: ignore[attr-defined]
    assert again.workflow_id == workflow_id(dag_id, BD)  # type: ignore[attr-defined]
    assert per_customer(sink) == {f"cust-{n:04d}": 1 for n in range(10)}


def test_lease_held_by_airflow_makes_the_activity_wait_without_using_attempts(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    dag_id = new_dag()
    spec = billing_spec(dag_id, count=5)
    key = str(lease_key(dag_id, "charge", BD))
    airflow = Holder.airflow(dag_id=dag_id, run_id="manual__1", task_id="charge", try_number=1)
    held = lease_store.acquire(key, airflow, ttl=4.0).lease

    async def scenario() -> tuple[object, list]:  # type: ignore[type-arg]
        async with running_worker(config, lease_store) as client:
            handover = Handover(client, config.task_queue("default"))
            got = await handover.start_or_attach(spec, BD)
            await asyncio.sleep(2.0)
            # Airflow's try fails: its lease is failed; the waiting activity then takes it
            lease_store.fail(held, "airflow try failed")
            handle = run_handle(client, got.workflow_id)
            return await handle.result(), await history_events(client, got.workflow_id)

    result, events = asyncio.run(scenario())
    assert result.status == "success"  # type: ignore[attr-defined]
    failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert failed == []
    timers = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert timers, "the held lease was waited for on a durable timer"
    outcomes = [(h["outcome"], h["holder"]["engine"]) for h in lease_store.history(key)]
    assert ("held", "temporal") in outcomes  # the activity asked while Airflow held it
    assert outcomes[-2:] == [("granted", "temporal"), ("succeeded", "temporal")]
    assert per_customer(sink) == {f"cust-{n:04d}": 1 for n in range(5)}


def test_already_succeeded_task_returns_the_recorded_result_and_charges_nobody(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    dag_id = new_dag()
    spec = billing_spec(dag_id, count=5)
    key = str(lease_key(dag_id, "charge", BD))
    airflow = Holder.airflow(dag_id=dag_id, run_id="scheduled__1", task_id="charge", try_number=1)
    lease_store.complete(lease_store.acquire(key, airflow).lease, {"charged": 5, "by": "airflow"})

    async def scenario() -> object:
        async with running_worker(config, lease_store) as client:
            got = await Handover(client, config.task_queue("default")).start_or_attach(spec, BD)
            return await run_handle(client, got.workflow_id).result()

    result = asyncio.run(scenario())
    assert result.tasks["charge"].result == {"charged": 5, "by": "airflow"}  # type: ignore[attr-defined]
    assert per_customer(sink) == {}


def test_failing_task_fails_the_run_with_its_error_after_five_attempts(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    dag_id = new_dag()
    spec = DagSpec(
        dag_id=dag_id,
        tasks=(
            TaskSpec(
                "boom",
                callable_ref="builtins:int",
                args=("not a number",),
                side_effect_free=True,
                retry=RetrySpec(initial_interval_s=0.1, maximum_interval_s=0.2),
            ),
            TaskSpec("after", upstream=("boom",), callable_ref="builtins:len", args=([],)),
        ),
    )

    async def scenario() -> tuple[BaseException, int]:
        async with running_worker(config, lease_store) as client:
            got = await Handover(client, config.task_queue("default")).start_or_attach(spec, BD)
            with pytest.raises(WorkflowFailureError) as caught:
                await run_handle(client, got.workflow_id).result()
            events = await history_events(client, got.workflow_id)
            failed = [
                e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
            ]
            started = events[events.index(failed[0]) - 1]
            return caught.value, started.activity_task_started_event_attributes.attempt

    error, attempts = asyncio.run(scenario())
    assert "boom: ValueError: invalid literal for int()" in str(error.cause)
    assert attempts == 5
    key = str(lease_key(dag_id, "boom", BD))
    row = lease_store.get(key)
    assert row is not None
    assert row["state"] == "failed"
    assert [h["event"] for h in lease_store.history(key)].count("fail") == 5
