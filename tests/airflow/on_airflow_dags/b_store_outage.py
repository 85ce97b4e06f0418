"""A protected task whose lease store is its own Connection, so a test can take it down.

``lease_conn_id="b_outage_leases"`` points at a private PostgreSQL the test starts and stops
(``tests/airflow/test_on_airflow.py``); ``retries=0``, so a retry used up while the store is
down would fail the run.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import exactly_once_task

with DAG(
    "b_store_outage",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    tags=["scenario"],
):

    @exactly_once_task(sink_conn_id="billing_db", lease_conn_id="b_outage_leases", retries=0)
    def charge(fence: Fence, ti: Any = None) -> dict[str, Any]:
        with fence.transaction() as tx:
            if tx.claim("the-only-item"):
                tx.conn.execute(
                    "INSERT INTO b_on_airflow_rows (key, item, token, try_number) "
                    "VALUES (%s, %s, %s, %s)",
                    (fence.key, "the-only-item", fence.token, ti.try_number),
                )
        return {"token": fence.token}

    charge()
