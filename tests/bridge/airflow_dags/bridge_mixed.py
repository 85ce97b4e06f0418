"""A DAG that mixes a protected task with ordinary ones, shadowed whole in ``shadow`` mode.

``extract`` (ordinary) -> ``charge`` (``@exactly_once_task``: each customer charged at the
payment processor through ``fence.external_call``, the answer written to ``billing.charges``)
-> ``report`` (ordinary). ``extract`` and ``report`` are declared side-effect-free, so every
task is shadow-safe and the DAG gets one Temporal shadow of the whole graph per business run
(``bridge.in_airflow.shadow_gate.shadow_route``: ``whole``), its charge fenced: the rows
captured and rolled back, the calls recorded and not sent.

The processor's address is the run's ``processor`` param (the test's processor; the shared
harness's Airflow has no ``payment_processor`` connection). When the run's ``diverge`` param is
set, ``extract`` adds a customer in an engine whose ``BRIDGE_ORDINARY_NOTE`` is ``temporal``
(the test's worker; Airflow has none): a shadow that would charge one customer more. Test
wiring as in ``bridge_ordinary.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task
from billing_charges import charge_at_processor, customers

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import exactly_once_task
from airflow_plugins.protection.routing import register_router
from bridge.in_airflow.router import BridgeRouter

os.environ.setdefault(
    "BRIDGE_TEMPORAL_ADDR", f"127.0.0.1:{os.environ.get('EO_TEST_TEMPORAL_PORT', '27233')}"
)
os.environ.setdefault("BRIDGE_QUEUE_PREFIX", "bridge-e2e")
os.environ.setdefault("BRIDGE_COMPARE_POLL_S", "1")

register_router(BridgeRouter())

EXTRA_CUSTOMER = "cust-0999"

with DAG(
    dag_id="bridge_mixed",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    tags=["bridge", "side-effect-free:extract", "side-effect-free:report"],
    params={
        "customers": Param(3, type="integer"),
        "diverge": Param(False, type="boolean"),
        "processor": Param("", type="string"),
    },
) as dag:

    @task
    def extract(count: str, diverge: str) -> list[str]:
        """The customers of the night (one more in the test's worker when asked to diverge)."""
        names = customers(int(count))
        if diverge == "True" and os.environ.get("BRIDGE_ORDINARY_NOTE") == "temporal":
            names.append(EXTRA_CUSTOMER)
        return names

    @exactly_once_task(sink_conn_id="billing_db", period="day")
    def charge(fence: Fence, names: list[str], processor: str, writer: str) -> dict[str, Any]:
        """Charges each customer once at the processor, through the fence."""
        return charge_at_processor(fence, names, delay=0.0, writer=writer, api_base=processor)

    @task
    def report(result: dict[str, Any]) -> dict[str, int]:
        """What the night charged."""
        return {"charged": int(result["charged"]), "customers": int(result["customers"])}

    report(
        charge(
            extract(count="{{ params.customers }}", diverge="{{ params.diverge }}"),
            processor="{{ params.processor }}",
            writer="{{ run_id }}",
        )
    )
