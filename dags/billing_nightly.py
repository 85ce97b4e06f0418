"""Nightly billing: charge each of the 340 customers once for the business date.

The incident DAG. ``charge`` is an ``ExactlyOnceOperator``: its lease key is
``billing_nightly/charge/<business date>``. Each customer is charged at the payment processor
(the ``payment_processor`` connection, Stripe's API through the official SDK) with
``fence.external_call``: the customer's stable idempotency key and the try's fencing token go
with the call, and the processor's answer (charge id, or a decline) is recorded in the billing
table through the sink's fence. A superseded try (scheduler died, task cleared, process paused
past its lease, a second run of the same date) is refused at the billing database, its late
call is a replay at the processor, and a taken-over run skips the customers already answered.

Run it by hand for a given date with conf ``{"business_date": "2024-02-15"}``. Params:
``charge_delay`` (seconds per customer: the real run takes ~4 h; tests use milliseconds) and
``customers`` (how many).
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task
from billing_charges import (
    CUSTOMER_COUNT,
    SINK_CONN_ID,
    charge_at_processor,
    customers,
    prepare_sink,
)

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.operators import ExactlyOnceOperator


def charge(fence: Fence, count: int, delay: float, writer: str) -> dict[str, Any]:
    """Charges the night's customers at the payment processor, through the fence."""
    return charge_at_processor(fence, customers(int(count)), delay=float(delay), writer=writer)


with DAG(
    dag_id="billing_nightly",
    schedule="0 2 * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    tags=["billing", "example"],
    params={
        "charge_delay": Param(0.5, type="number", minimum=0),
        "customers": Param(CUSTOMER_COUNT, type="integer", minimum=1),
    },
    doc_md=__doc__,
) as dag:

    @task
    def prepare() -> None:
        """Creates the charges table and the sink fence if they are missing."""
        from airflow_plugins.protection.config import sink_dsn

        prepare_sink(sink_dsn(SINK_CONN_ID))

    charge_task = ExactlyOnceOperator(
        task_id="charge",
        python_callable=charge,
        sink_conn_id=SINK_CONN_ID,
        period="day",
        retry_delay=pendulum.duration(seconds=5),
        op_kwargs={
            "count": "{{ params.customers }}",
            "delay": "{{ params.charge_delay }}",
            "writer": "{{ run_id }}/try{{ ti.try_number }}",
        },
    )

    @task
    def report(result: Any) -> dict[str, Any]:
        """What downstream sees: the first run's result, even when a later run was skipped."""
        return dict(result or {})

    prepare() >> charge_task
    report(charge_task.output)
