"""The Airflow-level campaign's billing DAG (``tests/chaos/airflow_campaign.py``).

``billing_nightly``'s charge (the same ``charge_at_processor`` body: each customer charged at the
payment processor through ``fence.external_call``, the answer recorded in ``billing.charges``
through the sink's fence), in a DAG made for many short runs at once: no schedule (only the
campaign's triggered runs, each with its business date in the conf), up to 8 runs at once, and
enough quick retries that a run hit by several faults still finishes.

``chaos_billing_plain`` (the campaign's ``--plain``) is its twin with the plugin disabled: the
same body as the operator runs it with ``[exactly_once] enabled = False`` (``Fence.unprotected``,
as ``tests/e2e/dags/billing_twins.py`` does), so both modes share one stack.

``chaos_billing_mapped`` (the campaign's ``--mapped``) charges the same customers per tenant: a
``tenants`` task returns the run's ``params.tenants`` and the protected charge is mapped over it,
keyed by tenant (``map_index_template``), each tenant charging every n-th customer, as
``tenant_webhooks`` maps its deliveries.
"""

from __future__ import annotations

from typing import Any

import pendulum
import psycopg
from airflow.sdk import DAG, Param, get_current_context, task
from billing_charges import SINK_CONN_ID, charge_at_processor, customers

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.config import sink_dsn
from airflow_plugins.protection.decorators import exactly_once_task
from airflow_plugins.protection.operators import ExactlyOnceOperator

# many short runs at once, each of a few customers, only the campaign's (no schedule)
SHAPE: dict[str, Any] = {
    "schedule": None,
    "start_date": pendulum.datetime(2024, 1, 1, tz="UTC"),
    "max_active_runs": 8,
    "tags": ["billing", "chaos"],
    "params": {
        "charge_delay": Param(0.3, type="number", minimum=0),
        "customers": Param(20, type="integer", minimum=1),
    },
}


def charge(fence: Fence, count: int, delay: float, writer: str) -> dict[str, Any]:
    """Charges ``count`` customers at the payment processor, through the fence."""
    return charge_at_processor(fence, customers(int(count)), delay=float(delay), writer=writer)


with DAG(
    dag_id="chaos_billing",
    **SHAPE,
    doc_md=__doc__,
):
    ExactlyOnceOperator(
        task_id="charge",
        python_callable=charge,
        sink_conn_id=SINK_CONN_ID,
        period="day",
        retries=12,
        retry_delay=pendulum.duration(seconds=2),
        retry_exponential_backoff=False,
        op_kwargs={
            "count": "{{ params.customers }}",
            "delay": "{{ params.charge_delay }}",
            "writer": "{{ run_id }}/try{{ ti.try_number }}",
        },
    )


with DAG(
    dag_id="chaos_billing_plain",
    **SHAPE,
):

    @task(task_id="charge", retries=12, retry_delay=pendulum.duration(seconds=2))
    def charge_plain() -> dict[str, Any]:
        """``chaos_billing``'s charge as the plugin runs it with ``enabled = False``
        (``Fence.unprotected``: no lease, no fence, no idempotency key): plain Airflow."""
        context = get_current_context()
        ti, params = context["ti"], context["params"]
        business_date = str((context["dag_run"].conf or {})["business_date"])
        dsn = sink_dsn(SINK_CONN_ID)
        fence = Fence.unprotected(
            f"chaos_billing_plain/charge/{business_date}",
            business_date,
            lambda: psycopg.connect(dsn),
        )
        try:
            return charge_at_processor(
                fence,
                customers(int(params["customers"])),
                delay=float(params["charge_delay"]),
                writer=f"{ti.run_id}/try{ti.try_number}",
            )
        finally:
            fence.close()

    charge_plain()


with DAG(
    dag_id="chaos_billing_mapped",
    **{**SHAPE, "params": {**SHAPE["params"], "tenants": Param(["north", "south"], type="array")}},
):

    @task
    def tenants() -> list[str]:
        """The run's tenants, in the order their charges are mapped (map index = position)."""
        return [str(t) for t in get_current_context()["params"]["tenants"]]

    @exactly_once_task(
        sink_conn_id=SINK_CONN_ID,
        period="day",
        map_index_template="{{ task.op_kwargs['tenant'] }}",
        retries=12,
        retry_delay=pendulum.duration(seconds=2),
        retry_exponential_backoff=False,
    )
    def charge_tenant(
        fence: Fence, tenant: str, tenants: list[str], count: str, delay: str, writer: str
    ) -> dict[str, Any]:
        """Charges ``tenant``'s customers: every ``len(tenants)``-th of the first ``count``."""
        mine = customers(int(count))[tenants.index(tenant) :: len(tenants)]
        return charge_at_processor(fence, mine, delay=float(delay), writer=writer)

    names = tenants()
    charge_tenant.override(task_id="charge").partial(
        tenants=names,
        count="{{ params.customers }}",
        delay="{{ params.charge_delay }}",
        writer="{{ run_id }}/{{ ti.map_index }}/try{{ ti.try_number }}",
    ).expand(tenant=names)
