"""The bridge's scenario DAG on the shared Airflow harness: nightly billing whose protected
``charge`` task is routed by its cutover mode (the bridge's router).

Test wiring: the harness has no per-suite Airflow settings, so this file installs the bridge's
router for its own tasks (``register_router``; a deployment sets ``[exactly_once] router =
bridge.in_airflow.router:BridgeRouter`` instead) and points the bridge at the test session's
Temporal dev server (port 27233, task queues ``bridge-e2e-*``, shadow comparisons polled every
second) unless the environment says otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

import pendulum
from airflow.sdk import DAG, Param
from billing_charges import charge_customers, customers

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.operators import ExactlyOnceOperator
from airflow_plugins.protection.routing import ProtectedRun, Route, register_router
from bridge.in_airflow.router import BridgeRouter, TemporalHandover

os.environ.setdefault("BRIDGE_TEMPORAL_ADDR", "127.0.0.1:27233")
os.environ.setdefault("BRIDGE_QUEUE_PREFIX", "bridge-e2e")
os.environ.setdefault("BRIDGE_COMPARE_POLL_S", "1")


class _SlowFirstResume(TemporalHandover):
    """Resumes the first try only after the run conf's ``first_resume_delay`` seconds, so a
    test can kill that resumed try before it reports (the resume is otherwise ~1 s)."""

    def resume(
        self, operator: Any, context: Mapping[str, Any], run: ProtectedRun, event: Any
    ) -> Any:
        if run.try_number == 1:
            time.sleep(float(run.conf.get("first_resume_delay", 0)))
        return super().resume(operator, context, run, event)


class _TestRouter(BridgeRouter):
    def route(self, run: ProtectedRun) -> Route:
        got = super().route(run)
        if isinstance(got.handover, TemporalHandover) and run.conf.get("first_resume_delay"):
            return dataclasses.replace(got, handover=_SlowFirstResume())
        return got


register_router(_TestRouter())


def charge(fence: Fence, count: int, delay: float, writer: str) -> dict[str, Any]:
    """Charges the night's customers through the fence (same code in both engines)."""
    return charge_customers(fence, customers(int(count)), delay=float(delay), writer=writer)


with DAG(
    dag_id="bridge_billing",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    tags=["bridge", "side-effect-free:none"],
    params={"customers": Param(30, type="integer"), "delay": Param(0.2, type="number")},
) as dag:
    ExactlyOnceOperator(
        task_id="charge",
        python_callable=charge,
        sink_conn_id="billing_db",
        period="day",
        retry_delay=pendulum.duration(seconds=2),
        op_kwargs={
            "count": "{{ params.customers }}",
            "delay": "{{ params.delay }}",
            "writer": "{{ run_id }}",
        },
    )
