"""The router keeps one primary per business run of a protected task, through a rollback.

A business run (the DAG and the business date) is fixed to the mode of its first try that asks.
After a rollback to ``airflow`` mid-run, what MIGRATION.md's rollback table says: a cleared task
of a business run fixed to ``temporal`` is handed to Temporal again (it attaches to the workflow,
or gets the recorded result), and so is a second Airflow DAG run of the same date; only the next
business date runs in Airflow. A run fixed to ``airflow`` stays in Airflow after a cut-over.
"""

from __future__ import annotations

import pytest

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.keys import LeaseKey
from airflow_plugins.protection.routing import ProtectedRun
from bridge.cutover import ModeStore
from bridge.in_airflow.router import BridgeRouter, TemporalHandover
from tests.bridge.test_dag_run import new_dag


def _try(dag_id: str, business_date: str, run_id: str, try_number: int = 1) -> ProtectedRun:
    return ProtectedRun(
        key=LeaseKey(dag_id, "charge", business_date),
        dag_id=dag_id,
        run_id=run_id,
        task_id="charge",
        map_index=-1,
        try_number=try_number,
        run_started_at=None,
        conf={"business_date": business_date},
    )


def test_a_business_run_keeps_its_engine_through_a_rollback(
    lease_store: LeaseStore, bridge_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__LEASE_DSN", bridge_db)
    dag_id = new_dag()
    modes = ModeStore(lease_store)
    router = BridgeRouter()

    def where(run: ProtectedRun) -> str:
        """The run's fixed mode, and who runs the try's work (a handover, or Airflow)."""
        route = router.route(run)
        if route.handover is None:
            return f"{route.mode}:airflow"
        assert isinstance(route.handover, TemporalHandover), route
        return f"{route.mode}:temporal"

    assert where(_try(dag_id, "2026-11-01", "scheduled__2026-11-01T02:00:00+00:00")) == (
        "airflow:airflow"
    )
    modes.set(dag_id, "temporal", actor="ops", reason="cut over", force=True)
    # a run fixed to airflow stays there: a cleared try, a second DAG run of the date
    assert where(_try(dag_id, "2026-11-01", "scheduled__2026-11-01T02:00:00+00:00", 2)) == (
        "airflow:airflow"
    )
    assert where(_try(dag_id, "2026-11-01", "manual__again")) == "airflow:airflow"
    handed = _try(dag_id, "2026-11-02", "scheduled__2026-11-02T02:00:00+00:00")
    assert where(handed) == "temporal:temporal"
    modes.set(dag_id, "airflow", actor="ops", reason="rollback mid-run")
    # rollback mid-run: the business run fixed to temporal keeps Temporal as its one primary
    assert where(_try(dag_id, "2026-11-02", handed.run_id, try_number=2)) == "temporal:temporal"
    assert where(_try(dag_id, "2026-11-02", "manual__second_run_of_the_date")) == (
        "temporal:temporal"
    )
    # the next business date runs in Airflow
    assert where(_try(dag_id, "2026-11-03", "scheduled__2026-11-03T02:00:00+00:00")) == (
        "airflow:airflow"
    )
