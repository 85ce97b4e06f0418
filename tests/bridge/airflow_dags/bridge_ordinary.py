"""An ordinary DAG (no protected task, no ``BridgeOperator``) whose ``shadow`` mode runs the
whole graph in Temporal beside Airflow (``bridge.in_airflow.whole_shadow``).

Four tasks, XComs between them, a branch and a non-default trigger rule. ``report`` returns
``BRIDGE_ORDINARY_NOTE`` from its engine's environment when the run's ``diverge`` param is set
(the test's worker sets it, Airflow does not): a run whose output differs between engines.
Test wiring as in ``bridge_billing.py`` (the bridge's router for its tasks, the test session's
Temporal dev server, comparisons polled every second).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_plugins.protection.routing import register_router
from bridge.in_airflow.router import BridgeRouter

os.environ.setdefault(
    "BRIDGE_TEMPORAL_ADDR", f"127.0.0.1:{os.environ.get('EO_TEST_TEMPORAL_PORT', '27233')}"
)
os.environ.setdefault("BRIDGE_QUEUE_PREFIX", "bridge-e2e")
os.environ.setdefault("BRIDGE_COMPARE_POLL_S", "1")

register_router(BridgeRouter())

with DAG(
    dag_id="bridge_ordinary",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    tags=["bridge", "side-effect-free"],
    params={"customers": Param(2, type="integer"), "diverge": Param(False, type="boolean")},
) as dag:

    @task
    def extract(count: str) -> list[str]:
        """The customers of the night."""
        return [f"cust-{i}" for i in range(int(count))]

    @task.branch
    def route(names: list[str]) -> str:
        """Many customers go in bulk, few one by one."""
        return "bulk" if len(names) > 3 else "single"

    @task
    def bulk(names: list[str]) -> dict[str, int]:
        """One batch of all."""
        return {"batches": 1, "customers": len(names)}

    @task
    def single(names: list[str]) -> dict[str, int]:
        """One batch each."""
        return {"batches": len(names), "customers": len(names)}

    @task(trigger_rule="none_failed_min_one_success")
    def report(names: list[str], diverge: str) -> dict[str, object]:
        """What the night did (the engine's note when the run asks for one)."""
        note = os.environ.get("BRIDGE_ORDINARY_NOTE", "airflow") if diverge == "True" else "-"
        return {"customers": len(names), "note": note}

    names = extract(count="{{ params.customers }}")
    chosen = route(names)
    done = [bulk(names), single(names)]
    chosen >> done
    done >> report(names, diverge="{{ params.diverge }}")
