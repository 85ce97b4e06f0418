"""A protected task for the plugin's own real-Airflow check: deferral while a lease is held.

``retries=0``: waiting for a held lease must not use up a retry, so a consumed retry would
fail the run.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import exactly_once_task

with DAG(
    "b_deferral",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    tags=["scenario"],
):

    @exactly_once_task(sink_conn_id="billing_db", retries=0)
    def charge(fence: Fence, ti: Any = None) -> dict[str, Any]:
        with fence.transaction() as tx:
            if tx.claim("the-only-item"):
                tx.conn.execute(
                    "INSERT INTO b_deferral_runs (key, token, try_number) VALUES (%s, %s, %s)",
                    (fence.key, fence.token, ti.try_number),
                )
        return {"token": fence.token}

    charge()
