"""The bridge on real Airflow (the shared harness), a real worker process and Temporal.

A DAG in ``temporal`` mode hands its protected task to Temporal: the task defers (no worker
slot) and gets the workflow's result as its XCom. The scheduler running the task is SIGKILLed
while the handed-over run works in Temporal: the run goes on and finishes once, and Airflow's
next try (the resumed try is killed too) attaches and reports its result. A user's clear of
the deferred task cancels the workflow; the new try's execution skips what was charged, also
after a rollback to ``airflow`` mid-run (the business run stays in Temporal; the next date runs
in Airflow). Shadow mode and the whole-DAG BridgeOperator run here too.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from airflow_plugins.lease import LeaseStore
from bridge.comparison import get_comparison
from bridge.config import BridgeConfig
from bridge.cutover import ModeStore
from bridge.identity import workflow_id
from bridge.spec import RunMode
from tests.bridge.conftest import SCENARIO_DAGS, scenario_worker, wait_for
from tests.harness.airflow_harness import EXTRA_DAG_FOLDERS, AirflowHarness, signal_pids
from tests.harness.fixtures import airflow  # noqa: F401  (the session fixture)

EXTRA_DAG_FOLDERS["bridge"] = SCENARIO_DAGS
DAG_ID = "bridge_billing"


@pytest.fixture(scope="module")
def bridge_on_airflow(
    airflow: AirflowHarness,  # noqa: F811
    temporal_address: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BridgeConfig]:
    """The lease store's bridge schema, one worker process."""
    assert temporal_address == "127.0.0.1:27233", "the scenario DAG points at this server"
    folder = tmp_path_factory.mktemp("bridge-worker")
    with scenario_worker(temporal_address, airflow.lease_dsn, airflow.sink_dsn, folder) as config:
        yield config


def _set_mode(airflow: AirflowHarness, mode: str, dag_id: str = DAG_ID) -> None:  # noqa: F811
    with LeaseStore(airflow.lease_dsn) as store:
        modes = ModeStore(store)
        if modes.get(dag_id).value != mode:
            modes.set(dag_id, mode, actor="test", reason="bridge e2e", force=True)


def _status(address: str, wid: str) -> WorkflowExecutionStatus | None:
    async def get() -> WorkflowExecutionStatus | None:
        client = await Client.connect(address)
        try:
            return (await client.get_workflow_handle(wid).describe()).status
        except Exception:
            return None

    return asyncio.run(get())


def _executions(address: str, wid: str) -> list[WorkflowExecutionStatus | None]:
    async def get() -> list[WorkflowExecutionStatus | None]:
        client = await Client.connect(address)
        return [w.status async for w in client.list_workflows(f'WorkflowId = "{wid}"')]

    return asyncio.run(get())


def _xcom(airflow: AirflowHarness, run_id: str) -> object:  # noqa: F811
    entry = airflow.client().request(
        "GET",
        f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/charge/xcomEntries/return_value",
    )
    return entry["value"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_scheduler_killed_while_the_run_works_in_temporal_finishes_once(
    airflow: AirflowHarness,  # noqa: F811
    bridge_on_airflow: BridgeConfig,
) -> None:
    """The scheduler that ran the try is SIGKILLed while the handed-over run works in Temporal;
    then the try that resumes when the workflow ends is killed too, so Airflow needs a next try
    (task heartbeat timeout 20 s in the harness). The run finishes once; the next try attaches
    and reports its result."""
    _set_mode(airflow, "temporal")
    day = airflow.fresh_business_date()
    wid = workflow_id(DAG_ID, day, part="charge")
    address = bridge_on_airflow.temporal_address
    # the first try's resume waits 20 s before it reports, so it is still there to be killed
    run_id = airflow.trigger_dag_run(
        DAG_ID,
        {"business_date": day, "customers": 30, "delay": 0.3, "first_resume_delay": 20},
    )
    first = airflow.wait_for_task_processes(DAG_ID, run_id, "charge")
    owner = airflow.scheduler_name(first.scheduler)
    assert owner is not None
    airflow.wait_for_task_state(DAG_ID, run_id, "charge", {"deferred"}, timeout=120)
    assert _status(address, wid) == WorkflowExecutionStatus.RUNNING
    airflow.kill_scheduler(owner, signal.SIGKILL)
    try:
        # the run goes on in Temporal; when it ends, the try resumes in a new process: kill it
        resumed = wait_for(
            lambda: (
                (p := airflow.task_processes(DAG_ID, run_id, "charge")) is not None
                and p.task != first.task
                and p
            ),
            timeout=180,
            what="the try to resume after the workflow ended",
        )
        os.kill(resumed.task, signal.SIGSTOP)
        signal_pids([resumed.task, resumed.supervisor], signal.SIGKILL)
        run = airflow.wait_for_run_state(DAG_ID, run_id, timeout=300)
    finally:
        airflow.ensure_schedulers()
    assert run["state"] == "success"
    tries = airflow.task_tries(DAG_ID, run_id, "charge")
    assert max(t["try_number"] for t in tries) >= 2, "Airflow retried the dead try"
    # one execution, each customer charged once, and the next try reported its result
    assert _executions(address, wid) == [WorkflowExecutionStatus.COMPLETED]
    charged = airflow.charges(day)
    assert len(charged) == 30
    assert len({c["customer"] for c in charged}) == 30
    assert {c["token"] for c in charged} == {charged[0]["token"]}
    result = _xcom(airflow, run_id)
    assert isinstance(result, dict)
    assert result["charged"] == 30


def _cleared_mid_run(airflow: AirflowHarness, address: str, *, rollback: bool) -> str:  # noqa: F811
    """A run of 30 customers handed to Temporal, its deferred task cleared by a user after a few
    charges (after a rollback to ``airflow``, with ``rollback``): the clear cancels the workflow,
    the task is handed over again and a new execution finishes what is left. Returns the date."""
    _set_mode(airflow, "temporal")
    day = airflow.fresh_business_date()
    wid = workflow_id(DAG_ID, day, part="charge")
    run_id = airflow.trigger_dag_run(DAG_ID, {"business_date": day, "customers": 30, "delay": 1.0})
    airflow.wait_for_task_state(DAG_ID, run_id, "charge", {"deferred"}, timeout=120)
    wait_for(lambda: len(airflow.charges(day)) >= 3, timeout=90, what="a few charges")
    if rollback:
        _set_mode(airflow, "airflow")  # mid-run
    airflow.clear_task(DAG_ID, run_id, "charge")
    wait_for(
        lambda: WorkflowExecutionStatus.CANCELED in _executions(address, wid),
        timeout=90,
        what=f"the user's clear to cancel the workflow ({_executions(address, wid)})",
    )
    assert len(airflow.charges(day)) < 30, "the run finished before the clear: no cancel to see"
    run = airflow.wait_for_run_state(DAG_ID, run_id, timeout=300)
    assert run["state"] == "success"
    # the cleared task handed over again: a new execution, which skipped charged customers
    assert sorted(_executions(address, wid), key=str) == sorted(
        [WorkflowExecutionStatus.CANCELED, WorkflowExecutionStatus.COMPLETED], key=str
    )
    charged = airflow.charges(day)
    assert len(charged) == 30
    assert len({c["customer"] for c in charged}) == 30
    return day


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_users_clear_of_the_deferred_task_cancels_the_workflow(
    airflow: AirflowHarness,  # noqa: F811
    bridge_on_airflow: BridgeConfig,
) -> None:
    day = _cleared_mid_run(airflow, bridge_on_airflow.temporal_address, rollback=False)
    # the cancelled run's token, then the new one's
    assert len({c["token"] for c in airflow.charges(day)}) == 2


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rollback_mid_run_keeps_that_business_run_in_temporal_through_a_clear(
    airflow: AirflowHarness,  # noqa: F811
    bridge_on_airflow: BridgeConfig,
) -> None:
    """MIGRATION.md's rollback table (``temporal`` -> ``airflow``): a business run fixed to
    ``temporal`` before the change stays there, its one primary, so a user's clear of its task
    after the rollback hands it to Temporal again (the new execution skips what was charged),
    while the next business date runs in Airflow with no workflow at all."""
    _cleared_mid_run(airflow, bridge_on_airflow.temporal_address, rollback=True)
    later = airflow.fresh_business_date()
    run_id = airflow.trigger_dag_run(
        DAG_ID, {"business_date": later, "customers": 5, "delay": 0.05}
    )
    assert airflow.wait_for_run_state(DAG_ID, run_id, timeout=300)["state"] == "success"
    address = bridge_on_airflow.temporal_address
    assert _executions(address, workflow_id(DAG_ID, later, part="charge")) == []
    assert len({c["customer"] for c in airflow.charges(later)}) == len(airflow.charges(later)) == 5


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_shadow_mode_on_airflow_leaves_the_sink_to_airflow_and_compares(
    airflow: AirflowHarness,  # noqa: F811
    bridge_on_airflow: BridgeConfig,
) -> None:
    _set_mode(airflow, "shadow")
    day = airflow.fresh_business_date()
    wid = workflow_id(DAG_ID, day, RunMode.SHADOW, part="charge")
    run_id = airflow.trigger_dag_run(DAG_ID, {"business_date": day, "customers": 20, "delay": 0.1})
    run = airflow.wait_for_run_state(DAG_ID, run_id, timeout=300)
    assert run["state"] == "success"
    with LeaseStore(airflow.lease_dsn) as store:
        row = wait_for(
            lambda: get_comparison(store, DAG_ID, day), timeout=120, what="the comparison row"
        )
        primary = store.get(f"{DAG_ID}/charge/{day}")
    # the shadow workflow writes the comparison row, then finishes: one execution, completed
    executions = wait_for(
        lambda: (
            (found := _executions(bridge_on_airflow.temporal_address, wid))
            and WorkflowExecutionStatus.RUNNING not in found
            and found
        ),
        timeout=60,
        what="the shadow workflow to close",
    )
    assert executions == [WorkflowExecutionStatus.COMPLETED]
    charged = airflow.charges(day)
    # Airflow (primary) charged each customer once; the shadow's writes were rolled back
    assert len(charged) == 20
    assert {c["token"] for c in charged} == {primary["token"]}  # type: ignore[index]
    assert primary["holder"]["engine"] == "airflow"  # type: ignore[index]
    assert row["matched"] is True, row["differences"]
    assert row["primary_status"] == row["shadow_status"] == "success"
    assert len(row["shadow_items"]["charge"]) == 20
    assert len(row["shadow_rows"]["charge"]["billing.charges"]) == 20


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bridge_operator_hands_a_whole_dag_run_to_one_workflow(
    airflow: AirflowHarness,  # noqa: F811
    bridge_on_airflow: BridgeConfig,
) -> None:
    _set_mode(airflow, "temporal", "bridge_whole_graph")  # the operator obeys the graph's mode
    day = airflow.fresh_business_date()
    wid = workflow_id("bridge_whole_graph", day)
    first = airflow.trigger_dag_run("bridge_whole", {"business_date": day})
    second = airflow.trigger_dag_run("bridge_whole", {"business_date": day})  # a duplicate
    runs = [airflow.wait_for_run_state("bridge_whole", r, timeout=300) for r in (first, second)]
    assert [r["state"] for r in runs] == ["success", "success"]
    assert _executions(bridge_on_airflow.temporal_address, wid) == [
        WorkflowExecutionStatus.COMPLETED
    ]
    for run_id in (first, second):
        entry = airflow.client().request(
            "GET",
            f"/api/v2/dags/bridge_whole/dagRuns/{run_id}/taskInstances/run_in_temporal"
            "/xcomEntries/return_value",
        )
        result = entry["value"]
        assert result["status"] == "success"
        assert result["tasks"]["report"]["result"] == 12
    charged = airflow.charges(day)
    assert len(charged) == 12
    assert len({c["customer"] for c in charged}) == 12
