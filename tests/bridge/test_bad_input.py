"""Bad input gets a clear error and loses nothing (nothing is half-started)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import date, timedelta

import pendulum
import pytest
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.python import BranchPythonOperator
from airflow.providers.standard.sensors.time_delta import WaitSensor
from airflow.sdk import DAG, task

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.keys import lease_key
from airflow_plugins.protection.routing import ProtectedRun
from bridge.config import BridgeConfig, TemporalUnavailable
from bridge.identity import workflow_id
from bridge.in_airflow import handoff
from bridge.in_airflow.translate import UntranslatableDag, translate
from bridge.spec import DagSpec, TaskSpec
from bridge.temporal.client import connect
from bridge.temporal.handover import Handover, HandoverRefused, PayloadTooLarge
from tests.bridge.conftest import REPO, running_worker
from tests.bridge.test_dag_run import billing_spec, new_dag

BD = (date.today() - timedelta(days=1)).isoformat()
CLOSED_PORT = "127.0.0.1:27999"  # in the bridge's range, nothing listens there


def test_untranslatable_dag_is_reported_by_task_name_with_the_reason() -> None:
    with DAG("mixed", schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1)) as dag:

        @task
        def extract() -> list[str]:
            return ["a"]

        wait = WaitSensor(task_id="wait_for_file", time_to_wait=timedelta(minutes=1))
        branch = BranchPythonOperator(task_id="pick", python_callable=lambda: "load")
        bash = BashOperator(task_id="load", bash_command="echo {{ ds }}")
        done = EmptyOperator(task_id="done", trigger_rule="all_done")
        extract() >> wait >> branch >> bash >> done

    translation = translate(dag)
    assert translation.spec is None
    reasons = {u.task_id: u.reason for u in translation.untranslatable}
    # the BashOperator runs unchanged in a worker (tests/bridge/test_operators.py); branching
    # and the all_done rule are decided by the workflow (tests/bridge/test_corpus_truth.py)
    assert set(reasons) == {"wait_for_file"}
    assert "sensor" in reasons["wait_for_file"]
    report = str(UntranslatableDag(translation))
    assert report.startswith("mixed: NOT translatable")
    assert "wait_for_file (WaitSensor)" in report


def test_broken_graph_is_refused_before_anything_starts(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    dag_id = new_dag()
    spec = DagSpec(dag_id, (TaskSpec("a", upstream=("b",)), TaskSpec("b", upstream=("a",))))

    async def scenario() -> int:
        async with running_worker(config, lease_store) as client:
            with pytest.raises(HandoverRefused, match="cycle"):
                await Handover(client, config.task_queue("default")).start_or_attach(spec, BD)
            wid = workflow_id(dag_id, BD)
            return len([w async for w in client.list_workflows(f'WorkflowId = "{wid}"')])

    assert asyncio.run(scenario()) == 0


def test_payload_over_the_size_limit_is_refused_and_nothing_starts(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    dag_id = new_dag()
    big = TaskSpec("load", callable_ref="builtins:len", args=("x" * 3_000_000,))
    spec = DagSpec(dag_id, (big,))

    async def scenario() -> int:
        async with running_worker(config, lease_store) as client:
            with pytest.raises(PayloadTooLarge, match="over the 2000000-byte limit"):
                await Handover(client, config.task_queue("default")).start_or_attach(spec, BD)
            wid = workflow_id(dag_id, BD)
            return len([w async for w in client.list_workflows(f'WorkflowId = "{wid}"')])

    assert asyncio.run(scenario()) == 0


def test_temporal_unreachable_fails_clearly_and_starts_nothing(
    bridge_db: str, lease_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TemporalUnavailable, match="unreachable"):
        asyncio.run(connect(BridgeConfig(temporal_address=CLOSED_PORT), timeout_s=5))
    # the Airflow side's handover (the child process) says the same; no lease was touched
    dag_id = new_dag()
    monkeypatch.setenv("BRIDGE_TEMPORAL_ADDR", CLOSED_PORT)
    monkeypatch.setenv("BRIDGE_LEASE_DSN", bridge_db)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    with pytest.raises(TemporalUnavailable):
        handoff.request(billing_spec(dag_id), BD, part="charge")
    assert lease_store.list_leases(prefix=dag_id) == []


def test_protected_task_routed_to_unreachable_temporal_fails_for_a_retry(
    bridge_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_plugins.protection.operators import ExactlyOnceOperator
    from bridge.in_airflow.router import TemporalHandover

    def charge(fence: object, count: int) -> int:
        return count

    with DAG("billing_route", schedule=None, start_date=pendulum.datetime(2024, 1, 1)) as dag:
        op = ExactlyOnceOperator(
            task_id="charge",
            python_callable=charge,
            sink_conn_id="billing_db",
            op_kwargs={"count": 3},
        )
    run = ProtectedRun(
        key=lease_key("billing_route", "charge", BD), dag_id="billing_route", run_id="manual__1",
        task_id="charge", map_index=-1, try_number=1, run_started_at=None, conf={},
    )  # fmt: skip
    monkeypatch.setenv("BRIDGE_TEMPORAL_ADDR", CLOSED_PORT)
    monkeypatch.setenv("BRIDGE_LEASE_DSN", bridge_db)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    with pytest.raises(AirflowException, match="nothing was started") as caught:
        TemporalHandover().start(op, {"dag": dag}, run)
    assert not isinstance(caught.value, AirflowFailException)  # Airflow retries it


def test_cli_inventory_exits_nonzero_for_untranslatable_dags(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "inventory", "--dags-folder", str(REPO / "dags")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'dags'}"},
    )  # fmt: skip
    assert "billing_nightly" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith('{"dags":')
    assert done.returncode in (0, 1)
    if "NOT translatable" in done.stdout:
        assert done.returncode == 1
