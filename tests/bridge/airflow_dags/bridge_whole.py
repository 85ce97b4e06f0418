"""A whole DAG run handed to Temporal by ``BridgeOperator`` (the bridge's scenario DAGs).

``bridge_whole_graph`` is the graph (never scheduled by Airflow: no schedule, paused);
``bridge_whole`` is the driver whose one task hands a business run of the graph to Temporal, as
one workflow execution whose id derives from the run's lease key. Test wiring as in
``bridge_billing.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pendulum
from airflow.sdk import DAG, task
from billing_charges import charge_customers, customers

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import exactly_once_task
from bridge.in_airflow.operator import BridgeOperator

os.environ.setdefault("BRIDGE_TEMPORAL_ADDR", "127.0.0.1:27233")
os.environ.setdefault("BRIDGE_QUEUE_PREFIX", "bridge-e2e")

with DAG(
    dag_id="bridge_whole_graph",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    is_paused_upon_creation=True,
    tags=["bridge", "side-effect-free:extract", "side-effect-free:report"],
) as graph:

    @task
    def extract() -> list[str]:
        """The customers to bill."""
        return customers(12)

    @exactly_once_task(sink_conn_id="billing_db")
    def charge(fence: Fence, names: list[str]) -> dict[str, Any]:
        """Charges them through the fence (in a Temporal activity, same code)."""
        return charge_customers(fence, names, delay=0.05, writer="bridge_whole")

    @task
    def report(result: dict[str, Any]) -> int:
        """What downstream sees."""
        return int(result["charged"])  # every holder's charges of the date

    report(charge(extract()))

with DAG(
    dag_id="bridge_whole",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    tags=["bridge"],
) as driver:
    BridgeOperator(task_id="run_in_temporal", source_dag=graph, period="day")
