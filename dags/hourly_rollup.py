"""Hourly analytics rollup: charges per hour into ``analytics.hourly_charges``.

An ``ExactlyOnceOperator`` keyed ``hourly_rollup/rollup/<YYYY-MM-DDTHH>``: the hour is rolled
up once (a re-run of a succeeded hour returns the recorded figures), and its upsert is written
through the fenced transaction so a superseded try cannot overwrite a newer one's result.
A manual run names its hour with conf ``{"business_date": "2024-02-15T02"}``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, task
from warehouse import WAREHOUSE_CONN_ID, dsn, prepare, sql

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.operators import ExactlyOnceOperator


def roll_up(fence: Fence) -> dict[str, Any]:
    """Upserts the hour's totals (one fenced transaction)."""
    start = datetime.fromisoformat(fence.business_date + ":00:00+00:00")
    with fence.transaction() as tx:
        row = tx.conn.execute(
            sql("rollup_hour"),
            {
                "hour": fence.business_date,
                "start": start,
                "end": start + timedelta(hours=1),
                "token": fence.token,
            },
        ).fetchone()
    charges, cents = row if row else (0, 0)
    return {"hour": fence.business_date, "charges": int(charges), "amount_cents": int(cents)}


with DAG(
    dag_id="hourly_rollup",
    schedule="@hourly",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["analytics", "example"],
    doc_md=__doc__,
):

    @task
    def prepare_tables() -> None:
        """Creates the warehouse tables if they are missing."""
        prepare(dsn())

    prepare_tables() >> ExactlyOnceOperator(
        task_id="rollup",
        python_callable=roll_up,
        sink_conn_id=WAREHOUSE_CONN_ID,
        period="hour",
        retry_delay=pendulum.duration(seconds=10),
    )
