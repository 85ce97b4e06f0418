"""The whole-DAG shadow of an ordinary DAG on real Airflow (the shared harness), a real worker
process and Temporal, compared task by task through Airflow's REST API.

``bridge_ordinary`` (no protected task: four tasks, XComs, a branch, a trigger rule) is set to
``shadow`` with the real command (its shadow gate passes: the DAG is declared side-effect-free).
Each Airflow run of a business date also runs the whole graph in Temporal; the comparison row
says, task by task, what each engine did. A run whose ``report`` output differs between engines
(the worker's environment) diverges and ``mode set ... temporal`` is refused naming its date;
after ``BRIDGE_READY_AFTER`` (2) matching runs it is allowed without ``--force``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_plugins.lease import LeaseStore
from bridge.comparison import get_comparison
from bridge.config import BridgeConfig
from bridge.cutover import ModeStore, migrate_bridge
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


def _mode_set(airflow: AirflowHarness, mode: str) -> subprocess.CompletedProcess[str]:  # noqa: F811
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", "mode", "set", DAG_ID, mode, *WHO],
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


def _back_to_airflow(airflow: AirflowHarness) -> None:  # noqa: F811
    with LeaseStore(airflow.lease_dsn) as store:
        modes = ModeStore(store)
        if modes.get(DAG_ID).value != "airflow":
            modes.set(DAG_ID, "airflow", actor="test", reason="e2e", force=True)


def _run(airflow: AirflowHarness, day: str, diverge: bool) -> str:  # noqa: F811
    return airflow.trigger_dag_run(
        DAG_ID, {"business_date": day, "customers": 2, "diverge": diverge}
    )


def _compared(airflow: AirflowHarness, day: str) -> dict[str, Any]:  # noqa: F811
    with LeaseStore(airflow.lease_dsn) as store:
        row: dict[str, Any] = wait_for(
            lambda: get_comparison(store, DAG_ID, day), timeout=180, what=f"comparison {day}"
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
