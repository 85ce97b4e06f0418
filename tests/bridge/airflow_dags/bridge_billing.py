"""The bridge's scenario DAG on the shared Airflow harness: nightly billing whose protected
``charge`` task is routed by its cutover mode (the bridge's router).

Test wiring: the harness has no per-suite Airflow settings, so this file installs the bridge's
router for its own tasks (``register_router``; a deployment sets ``[exactly_once] router =
bridge.in_airflow.router:BridgeRouter`` instead) and points the bridge at the test session's
Temporal dev server (port 27233, task queues ``bridge-e2e-*``, shadow comparisons polled every
second) unless the environment says otherwise.
"""

from __future__ import annotations

import os
from typing import Any

import pendulum
from airflow.sdk import DAG, Param
from billing_charges import charge_customers, customers

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.operators import ExactlyOnceOperator
from airflow_plugins.protection.routing import register_router
from bridge.in_airflow.router import BridgeRouter

os.environ.setdefault("BRIDGE_TEMPORAL_ADDR", "127.0.0.1:27233")
os.environ.setdefault("BRIDGE_QUEUE_PREFIX", "bridge-e2e")
os.environ.setdefault("BRIDGE_COMPARE_POLL_S", "1")
register_router(BridgeRouter())


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
