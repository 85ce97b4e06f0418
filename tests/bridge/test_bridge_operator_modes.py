"""``BridgeOperator`` obeys the graph's cutover mode, fixed per business run, on the real
Temporal server and lease store (the operator's ``execute`` called as Airflow's task runner
calls it, its handover through the real child process).

* ``airflow``: nothing handed over, no workflow of the date; the task is skipped;
* ``shadow``: the shadow workflow of the date is started, no primary; the task is skipped;
* ``temporal``: the primary workflow runs the graph; the task defers on it.

A mode change mid-run does not change a business run already fixed: a retry (or a second
driver run) of a date fixed to ``shadow`` after the DAG went to ``temporal`` still starts no
primary; one fixed to ``temporal`` after a rollback to ``airflow`` still attaches to Temporal.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.cutover import ModeStore
from bridge.identity import workflow_id
from bridge.in_airflow.operator import BridgeOperator
from bridge.spec import RunMode
from tests.bridge.conftest import running_worker


def customers() -> list[str]:
    """The graph's first task."""
    return ["cust-1", "cust-2", "cust-3"]


def count(rows: list[str]) -> int:
    """The graph's second task."""
    return len(rows)


def _driver(graph_id: str) -> tuple[BridgeOperator, DAG]:
    start = pendulum.datetime(2024, 1, 1, tz="UTC")
    with DAG(graph_id, schedule=None, start_date=start, tags=["side-effect-free"]) as graph:
        rows = PythonOperator(task_id="extract", python_callable=customers)
        PythonOperator(task_id="count", python_callable=count, op_args=[rows.output])
    with DAG(f"{graph_id}_driver", schedule=None, start_date=start) as driver:
        op = BridgeOperator(task_id="run_in_temporal", source_dag=graph, period="day")
    return op, driver


def _context(driver: DAG, business_date: str, run: str) -> dict[str, Any]:
    run_id = f"manual__{run}"
    ti = SimpleNamespace(
        dag_id=driver.dag_id, task_id="run_in_temporal", run_id=run_id, map_index=-1, try_number=1
    )
    dag_run = SimpleNamespace(
        conf={"business_date": business_date}, logical_date=None, run_id=run_id, start_date=None
    )
    return {"dag": driver, "dag_run": dag_run, "ti": ti, "run_id": run_id}


async def _status(client: Client, wid: str) -> WorkflowExecutionStatus | None:
    try:
        return (await client.get_workflow_handle(wid).describe()).status
    except RPCError:
        return None  # no such workflow


@pytest.mark.timeout(300)
def test_bridge_operator_obeys_the_mode_fixed_for_each_business_run(
    config: BridgeConfig, lease_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "BRIDGE_TEMPORAL_ADDR": config.temporal_address,
        "BRIDGE_QUEUE_PREFIX": config.task_queue_prefix,
        "BRIDGE_LANES": "default:8",
        "BRIDGE_LEASE_DSN": config.lease_dsn or "",
    }.items():
        monkeypatch.setenv(name, value)
    graph_id = f"opmodes_{uuid.uuid4().hex[:8]}"
    op, driver = _driver(graph_id)
    modes = ModeStore(lease_store)
    today = datetime.now(UTC).date()
    old, shadowed, handed, rolled = (str(today - timedelta(days=n)) for n in (4, 3, 2, 1))

    def set_mode(mode: str) -> None:
        modes.set(graph_id, mode, actor="test", reason="operator modes", force=True)

    def execute(business_date: str, run: str) -> str:
        """What the operator's try did: skipped, or deferred on a workflow (its id)."""
        try:
            op.execute(_context(driver, business_date, run))
        except AirflowSkipException as exc:
            return f"skipped: {exc}"
        except TaskDeferred as deferred:
            return str(deferred.trigger.workflow_id)  # type: ignore[attr-defined]
        raise AssertionError("the operator neither skipped nor deferred")

    async def scenario() -> None:
        async with running_worker(config, lease_store) as client:
            # airflow: nothing handed over, no workflow of the date at all
            assert "fixed to mode airflow" in await asyncio.to_thread(execute, old, "a1")
            # shadow: the shadow of the date is started, no primary
            set_mode("shadow")
            assert "fixed to mode shadow" in await asyncio.to_thread(execute, shadowed, "s1")
            shadow_id = workflow_id(graph_id, shadowed, RunMode.SHADOW)
            deadline = asyncio.get_running_loop().time() + 90
            while await _status(client, shadow_id) is None:  # fire and forget: wait for it
                assert asyncio.get_running_loop().time() < deadline, "no shadow workflow"
                await asyncio.sleep(0.3)
            # cut over mid-run: a retry of the date fixed to shadow still starts no primary
            set_mode("temporal")
            assert "fixed to mode shadow" in await asyncio.to_thread(execute, shadowed, "s2")
            # temporal: a new date is handed over and runs the graph as primary
            wid = await asyncio.to_thread(execute, handed, "t1")
            assert wid == workflow_id(graph_id, handed)
            result = await client.get_workflow_handle(wid).result()
            assert result["tasks"]["count"]["result"] == 3
            # rollback mid-run: the date fixed to temporal stays in Temporal (attaches, or the
            # recorded run's result), a new date runs in Airflow
            set_mode("airflow")
            again = await asyncio.to_thread(lambda: op.execute(_context(driver, handed, "t2")))
            # recorded (the run key's record): nothing started again
            assert again == {
                "status": "success",
                "tasks": {"extract": "succeeded", "count": "succeeded"},
            }
            assert "fixed to mode airflow" in await asyncio.to_thread(execute, rolled, "r1")
            for day in (old, shadowed, rolled):
                assert await _status(client, workflow_id(graph_id, day)) is None, day
            for day in (old, handed, rolled):
                shadow = workflow_id(graph_id, day, RunMode.SHADOW)
                assert await _status(client, shadow) is None, day
            assert [w.status async for w in client.list_workflows(f'WorkflowId = "{wid}"')] == [
                WorkflowExecutionStatus.COMPLETED
            ]
            await client.get_workflow_handle(shadow_id).terminate("test over")

    asyncio.run(scenario())
