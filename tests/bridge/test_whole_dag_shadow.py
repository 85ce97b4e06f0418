"""The whole-DAG shadow of an ordinary DAG on real Airflow (the shared harness), a real worker
process and Temporal, compared task by task through Airflow's REST API.

``bridge_ordinary`` (no protected task: four tasks, XComs, a branch, a trigger rule) is set to
``shadow`` with the real command (its shadow gate passes: the DAG is declared side-effect-free).
Each Airflow run of a business date also runs the whole graph in Temporal; the comparison row
says, task by task, what each engine did. A run whose ``report`` output differs between engines
(the worker's environment) diverges and ``mode set ... temporal`` is refused naming its date;
after ``BRIDGE_READY_AFTER`` (2) matching runs it is allowed without ``--force``.

``bridge_mixed`` (extract -> a protected charge at the payment processor -> report) is shadowed
whole the same way, its charge fenced: one shadow per business run, one row covering every task
and the charge's items and calls; the billing table and the processor each count every customer
once per run (the shadow wrote and charged nothing).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from airflow_plugins.demo.processor import PaymentProcessor
from airflow_plugins.lease import LeaseStore
from bridge.comparison import get_comparison
from bridge.config import BridgeConfig
from bridge.cutover import ModeStore, migrate_bridge
from bridge.identity import workflow_id
from bridge.spec import RunMode
from tests.bridge import workloads
from tests.bridge.conftest import (
    REPO,
    SCENARIO_DAGS,
    SCENARIO_QUEUES,
    kill_process,
    start_worker_process,
    wait_for,
)
from tests.harness.airflow_harness import EXTRA_DAG_FOLDERS, AirflowHarness
from tests.harness.fixtures import airflow  # noqa: F401  (the session fixture)

EXTRA_DAG_FOLDERS["bridge"] = SCENARIO_DAGS
DAG_ID = "bridge_ordinary"
WHO = ("--actor", "test", "--reason", "whole-DAG shadow e2e")
TASKS = ("extract", "route", "bulk", "single", "report")


@pytest.fixture(scope="module")
def worker(
    airflow: AirflowHarness,  # noqa: F811
    temporal_address: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BridgeConfig]:
    """One worker process that reads Airflow's side through its REST API (as admin)."""
    migrate_bridge(airflow.lease_dsn)
    config = BridgeConfig(
        temporal_address=temporal_address,
        task_queue_prefix=SCENARIO_QUEUES,
        lanes={"default": 4},
        lease_dsn=airflow.lease_dsn,
    )
    folder = tmp_path_factory.mktemp("whole-shadow-worker")
    user, password = airflow.admin
    proc = start_worker_process(
        config,
        folder / "worker.log",
        BRIDGE_DAGS_FOLDER=str(SCENARIO_DAGS),
        AIRFLOW_CONN_BILLING_DB=airflow.sink_dsn,
        AIRFLOW_HOME=str(folder),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "dags")]),
        BRIDGE_AIRFLOW_API_URL=airflow.base_url,
        BRIDGE_AIRFLOW_API_USER=user,
        BRIDGE_AIRFLOW_API_PASSWORD=password,
        BRIDGE_ORDINARY_NOTE="temporal",
    )
    try:
        yield config
    finally:
        kill_process(proc)


def _mode_set(
    airflow: AirflowHarness,  # noqa: F811
    mode: str,
    dag_id: str = DAG_ID,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", "mode", "set", dag_id, mode, *WHO],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={
            **os.environ,
            "BRIDGE_LEASE_DSN": airflow.lease_dsn,
            "BRIDGE_DAGS_FOLDER": str(SCENARIO_DAGS),
            "BRIDGE_READY_AFTER": "2",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "dags")]),
        },
    )


def _back_to_airflow(airflow: AirflowHarness, dag_id: str = DAG_ID) -> None:  # noqa: F811
    with LeaseStore(airflow.lease_dsn) as store:
        modes = ModeStore(store)
        if modes.get(dag_id).value != "airflow":
            modes.set(dag_id, "airflow", actor="test", reason="e2e", force=True)


def _run(airflow: AirflowHarness, day: str, diverge: bool) -> str:  # noqa: F811
    return airflow.trigger_dag_run(
        DAG_ID, {"business_date": day, "customers": 2, "diverge": diverge}
    )


def _compared(
    airflow: AirflowHarness,  # noqa: F811
    day: str,
    dag_id: str = DAG_ID,
) -> dict[str, Any]:
    with LeaseStore(airflow.lease_dsn) as store:
        row: dict[str, Any] = wait_for(
            lambda: get_comparison(store, dag_id, day), timeout=180, what=f"comparison {day}"
        )
    return row


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_ordinary_dag_in_shadow_runs_in_both_engines_and_is_compared_task_by_task(
    airflow: AirflowHarness,  # noqa: F811
    worker: BridgeConfig,
) -> None:
    _back_to_airflow(airflow)
    gate = _mode_set(airflow, "shadow")
    assert gate.returncode == 0, gate.stderr
    assert "starts a Temporal shadow of the whole DAG" in gate.stderr
    newest, middle, diverging = (airflow.fresh_business_date() for _ in range(3))

    run = _run(airflow, diverging, diverge=True)
    assert airflow.wait_for_run_state(DAG_ID, run, timeout=300)["state"] == "success"
    row = _compared(airflow, diverging)
    assert row["matched"] is False
    # only report differs: its return value and the "note" key Airflow pushes of its dict
    # (multiple_outputs), each digest as the row's per-task sides hold it
    assert row["differences"] == [
        {
            "what": "xcom",
            "task": "report",
            "key": key,
            "primary": row["primary_tasks"]["report"]["xcoms"][key],
            "shadow": row["shadow_tasks"]["report"]["xcoms"][key],
        }
        for key in ("note", "return_value")
    ]
    refused = _mode_set(airflow, "temporal")
    assert refused.returncode != 0
    assert f"its shadow run of {diverging} diverged from Airflow's" in refused.stderr

    runs = [_run(airflow, day, diverge=False) for day in (middle, newest)]
    for run in runs:
        assert airflow.wait_for_run_state(DAG_ID, run, timeout=300)["state"] == "success"
    for day in (middle, newest):
        row = _compared(airflow, day)
        assert row["matched"] is True, row["differences"]
        # both engines took the branch to "single" and skipped "bulk"; each task's XComs equal
        for side in ("primary_tasks", "shadow_tasks"):
            states = {t: row[side][t]["state"] for t in TASKS}
            assert states == {
                "extract": "success",
                "route": "success",
                "bulk": "skipped",
                "single": "success",
                "report": "success",
            }, side
        assert row["primary_tasks"]["report"]["xcoms"] == row["shadow_tasks"]["report"]["xcoms"]
        assert row["primary_tasks"]["report"]["xcoms"]["return_value"]
        assert row["primary_tasks"]["extract"]["ms"] is not None
    # the shadow never disturbed Airflow's run: each task ran there once
    for run in runs:
        tis = airflow.client().task_instances(DAG_ID, run)
        assert {t["task_id"]: t["try_number"] for t in tis if t["state"] == "success"} == {
            "extract": 1,
            "route": 1,
            "single": 1,
            "report": 1,
        }

    allowed = _mode_set(airflow, "temporal")
    assert allowed.returncode == 0, allowed.stderr
    _back_to_airflow(airflow)


MIXED = "bridge_mixed"
CUSTOMERS = ["cust-0001", "cust-0002", "cust-0003"]
EXTRA_CUSTOMER = "cust-0999"  # the one bridge_mixed's diverging shadow adds


async def _workflow_exists(address: str, workflow: str) -> bool:
    client = await Client.connect(address)
    try:
        await client.get_workflow_handle(workflow).describe()
    except RPCError:
        return False
    return True


def _billed(airflow: AirflowHarness, day: str) -> list[str]:  # noqa: F811
    with psycopg.connect(airflow.sink_dsn) as conn:
        rows = conn.execute(
            "SELECT customer FROM billing.charges WHERE business_date = %s", (day,)
        ).fetchall()
    return sorted(r[0] for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_dag_mixing_protected_and_ordinary_tasks_is_shadowed_whole_and_charges_once(
    airflow: AirflowHarness,  # noqa: F811
    worker: BridgeConfig,
    temporal_address: str,
) -> None:
    workloads._billing_charges().prepare_sink(airflow.sink_dsn)
    _back_to_airflow(airflow, MIXED)
    gate = _mode_set(airflow, "shadow", MIXED)
    assert gate.returncode == 0, gate.stderr
    assert "mixes protected tasks with side-effect-free ones" in gate.stderr
    newest, middle, diverging = (airflow.fresh_business_date() for _ in range(3))
    days = (diverging, middle, newest)

    with PaymentProcessor() as processor:

        def run(day: str) -> dict[str, Any]:
            conf = {"business_date": day, "diverge": day == diverging, "processor": processor.url}
            run_id = airflow.trigger_dag_run(MIXED, conf)
            assert airflow.wait_for_run_state(MIXED, run_id, timeout=300)["state"] == "success"
            tis = airflow.client().task_instances(MIXED, run_id)
            assert {t["task_id"]: t["try_number"] for t in tis} == {
                "extract": 1,
                "charge": 1,
                "report": 1,
            }
            return _compared(airflow, day, MIXED)

        # the diverging shadow would have charged one customer more: named, and nothing sent
        row = run(diverging)
        assert row["matched"] is False
        by_what = {(d["what"], d.get("task")) for d in row["differences"]}
        assert {("xcom", "extract"), ("sink_items", "charge"), ("external_calls", "charge")} <= (
            by_what
        )
        calls = next(d for d in row["differences"] if d["what"] == "external_calls")
        assert calls["only_shadow"] == [EXTRA_CUSTOMER]
        assert calls["only_primary"] == []
        refused = _mode_set(airflow, "temporal", MIXED)
        assert refused.returncode != 0
        assert f"its shadow run of {diverging} diverged from Airflow's" in refused.stderr

        rows = {day: run(day) for day in (middle, newest)}
        charged = processor.charges()

    # counted: each customer billed and charged once per business date, by Airflow alone
    for day in days:
        assert _billed(airflow, day) == CUSTOMERS, day
        at_processor = [c["customer"] for c in charged if c["metadata"]["business_date"] == day]
        assert sorted(at_processor) == CUSTOMERS, day
    assert len(charged) == len(CUSTOMERS) * len(days)

    for day in (middle, newest):
        row = rows[day]
        assert row["matched"] is True, row["differences"]
        for side in ("primary_tasks", "shadow_tasks"):  # every task, both engines
            assert {t: v["state"] for t, v in row[side].items()} == {
                "extract": "success",
                "charge": "success",
                "report": "success",
            }, side
        assert row["primary_tasks"]["charge"]["xcoms"] == row["shadow_tasks"]["charge"]["xcoms"]
        assert row["primary_items"]["charge"] == row["shadow_items"]["charge"] == CUSTOMERS
        # a call through the fence writes nothing in shadow: no billing row to capture
        assert row["shadow_rows"]["charge"] == {}
        sent = {c["item"]: c for c in row["primary_calls"]["charge"]}
        would = {c["item"]: c for c in row["shadow_calls"]["charge"]}
        assert sorted(would) == sorted(sent) == CUSTOMERS
        for item, call in would.items():
            assert call["idempotency_key"] == sent[item]["idempotency_key"]
            assert call["params"] == sent[item]["params"]
        # exactly one shadow of the business run: the whole graph's, none of the task alone
        whole = workflow_id(MIXED, day, RunMode.SHADOW)
        alone = workflow_id(MIXED, day, RunMode.SHADOW, part="charge")
        assert asyncio.run(_workflow_exists(temporal_address, whole))
        assert not asyncio.run(_workflow_exists(temporal_address, alone))

    allowed = _mode_set(airflow, "temporal", MIXED)
    assert allowed.returncode == 0, allowed.stderr
    _back_to_airflow(airflow, MIXED)
