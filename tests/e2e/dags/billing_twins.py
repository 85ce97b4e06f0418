"""Scenario twins of ``billing_nightly`` for the end-to-end tests (tests-only DAG bundle).

* ``billing_nightly_unprotected``: the same charge body as ``billing_nightly`` run the way the
  plugin runs it when ``[exactly_once] enabled = False`` (``Fence.unprotected``: a plain call
  to the payment processor with no idempotency key, a plain transaction per customer): plain
  Airflow.
* ``billing_nightly_tagged``: a plain ``@task`` (resumable: it skips customers already charged
  for the date) in a DAG tagged ``exactly-once``: protected only by the cluster policy.
* ``billing_nightly_untagged``: the same task and code without the tag: plain Airflow.

All take the business date from the run's conf ``business_date``.
"""

from __future__ import annotations

from typing import Any

import pendulum
import psycopg
from airflow.sdk import DAG, Param, get_current_context, task
from billing_charges import (
    CUSTOMER_COUNT,
    SINK_CONN_ID,
    charge_at_processor,
    charge_unless_charged,
    customers,
)

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.config import sink_dsn

PARAMS = {
    "charge_delay": Param(0.05, type="number", minimum=0),
    "customers": Param(CUSTOMER_COUNT, type="integer", minimum=1),
}
START = pendulum.datetime(2024, 1, 1, tz="UTC")


def _writer() -> tuple[str, str, dict[str, Any]]:
    context = get_current_context()
    ti = context["ti"]
    conf = context["dag_run"].conf or {}
    writer = f"{ti.run_id}/try{ti.try_number}"
    return str(conf["business_date"]), writer, context["params"]


with DAG(
    dag_id="billing_nightly_unprotected",
    schedule=None,
    start_date=START,
    max_active_runs=4,
    params=PARAMS,
    tags=["billing", "scenario"],
):

    @task(task_id="charge", retries=4, retry_delay=pendulum.duration(seconds=5))
    def charge_plain() -> dict[str, Any]:
        """``billing_nightly``'s charge with protection off."""
        business_date, writer, params = _writer()
        dsn = sink_dsn(SINK_CONN_ID)
        fence = Fence.unprotected(
            f"billing_nightly_unprotected/charge/{business_date}",
            business_date,
            lambda: psycopg.connect(dsn),
        )
        try:
            return charge_at_processor(
                fence,
                customers(int(params["customers"])),
                delay=float(params["charge_delay"]),
                writer=writer,
            )
        finally:
            fence.close()

    charge_plain()


def _resumable_charge() -> dict[str, Any]:
    business_date, writer, params = _writer()
    with psycopg.connect(sink_dsn(SINK_CONN_ID), autocommit=True) as conn:
        return charge_unless_charged(
            conn,
            business_date,
            customers(int(params["customers"])),
            delay=float(params["charge_delay"]),
            writer=writer,
        )


for dag_id, tags in (
    ("billing_nightly_tagged", ["billing", "scenario", "exactly-once", "exactly-once-period:day"]),
    ("billing_nightly_untagged", ["billing", "scenario"]),
):
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=START,
        max_active_runs=4,
        params=PARAMS,
        tags=tags,
    ):
        task(
            _resumable_charge,
            task_id="charge",
            retries=4,
            retry_delay=pendulum.duration(seconds=5),
        )()
