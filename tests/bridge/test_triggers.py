"""``WorkflowTrigger``: its serialization, and ``run()``/``on_kill()`` driven directly."""

from __future__ import annotations

import asyncio
from datetime import date, timedelta
from typing import Any

from temporalio.client import WorkflowExecutionStatus

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.in_airflow.workflow_trigger import WorkflowTrigger
from bridge.spec import DagSpec, RetrySpec, TaskSpec
from bridge.temporal.handover import Handover
from tests.bridge.conftest import running_worker
from tests.bridge.test_dag_run import billing_spec, new_dag

BD = (date.today() - timedelta(days=1)).isoformat()


def test_serialize_names_the_exact_classpath() -> None:
    trigger = WorkflowTrigger("dagrun:d/t/2024-02-15", "127.0.0.1:7233", "ns")
    path, kwargs = trigger.serialize()
    assert path == "bridge.in_airflow.workflow_trigger.WorkflowTrigger"
    assert WorkflowTrigger(**kwargs).serialize() == (path, kwargs)


async def _first_event(trigger: WorkflowTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger yielded nothing")


def test_run_yields_the_result_or_the_error_and_on_kill_cancels(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    ok_dag, bad_dag, slow_dag = new_dag(), new_dag(), new_dag()
    failing = DagSpec(
        bad_dag,
        (
            TaskSpec(
                "boom",
                callable_ref="builtins:int",
                args=("x",),
                retry=RetrySpec(maximum_attempts=1),
            ),
        ),
    )

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], WorkflowExecutionStatus | None]:
        async with running_worker(config, lease_store) as client:
            handover = Handover(client, config.task_queue("default"))
            ok = await handover.start_or_attach(billing_spec(ok_dag, count=3), BD)
            bad = await handover.start_or_attach(failing, BD)
            slow = await handover.start_or_attach(billing_spec(slow_dag, count=50, delay=0.2), BD)
            address = config.temporal_address
            success = await _first_event(WorkflowTrigger(ok.workflow_id, address))
            failure = await _first_event(WorkflowTrigger(bad.workflow_id, address))
            waiting = WorkflowTrigger(slow.workflow_id, address)
            pending = asyncio.ensure_future(_first_event(waiting))
            await asyncio.sleep(1.0)
            await waiting.on_kill()  # a user cleared the deferred task
            cancelled = await asyncio.wait_for(pending, 60)
            status = (await client.get_workflow_handle(slow.workflow_id).describe()).status
            return success, failure, cancelled, status

    success, failure, cancelled, status = asyncio.run(scenario())
    assert success["status"] == "success"
    assert success["result"]["tasks"]["charge"]["result"] == {"charged": 3, "cents": 300}
    assert failure["status"] == "failed"
    assert "invalid literal for int()" in failure["error"]
    assert cancelled["status"] == "cancelled"
    assert status == WorkflowExecutionStatus.CANCELED
