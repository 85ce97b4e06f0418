"""A protected task that works item by item, so a test can stop it mid-run.

The run conf gives ``items`` (how many) and ``delay`` (seconds per item). Only the first try
is slow, so a test can stop it mid-run and the next try (after a clear) finishes at once. Each
item is written in its own fenced transaction and checks the fence first, as a long billing
body should: a stopped body writes nothing more.
"""

from __future__ import annotations

import time
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import exactly_once_task

with DAG(
    "b_stoppable",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    tags=["scenario"],
):

    @exactly_once_task(sink_conn_id="billing_db", retries=0)
    def charge(fence: Fence, ti: Any = None, dag_run: Any = None) -> dict[str, Any]:
        items = [f"item-{n:03d}" for n in range(int(dag_run.conf.get("items", 10)))]
        delay = float(dag_run.conf.get("delay", 0.5)) if ti.try_number == 1 else 0.0
        written = 0
        for item in items:
            fence.check()
            with fence.transaction() as tx:
                if tx.claim(item):
                    tx.conn.execute(
                        "INSERT INTO b_on_airflow_rows (key, item, token, try_number) "
                        "VALUES (%s, %s, %s, %s)",
                        (fence.key, item, fence.token, ti.try_number),
                    )
                    written += 1
            time.sleep(delay)
        return {"token": fence.token, "written": written}

    charge()
