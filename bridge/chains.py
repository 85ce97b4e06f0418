"""Chains across DAGs while only some of them have moved to Temporal.

The lease store records every business run's outcome under its key, whichever engine ran it. A
downstream DAG gates on that record instead of on Airflow's task state, so the chain holds when
the upstream DAG runs in Airflow, in Temporal handed over by Airflow, or on a Temporal Schedule
with its Airflow DAG paused:

    @exactly_once_task
    def wait_for_etl(fence, business_date: str) -> dict:
        return upstream_result(lease_store(), "etl_daily", "load", business_date)
"""

from __future__ import annotations

import os
from typing import Any

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.keys import lease_key


class UpstreamNotDone(RuntimeError):
    """The upstream business run has not succeeded (yet): raise to retry later."""


def upstream_result(
    store: LeaseStore, dag_id: str, task_id: str, business_date: str, map_key: str | None = None
) -> Any:
    """The recorded result of an upstream task's business run, whichever engine ran it.

    Raises:
        UpstreamNotDone: it has not succeeded; Airflow's or Temporal's retry waits for it.
    """
    key = str(lease_key(dag_id, task_id, business_date, map_key))
    row = store.get(key)
    if row is None or row["state"] != "succeeded":
        state = "not started" if row is None else row["state"]
        raise UpstreamNotDone(f"{key} is {state}")
    return row["result"]


def upstream_gate(dag_id: str, task_id: str, business_date: str, map_key: str | None = None) -> Any:
    """``upstream_result`` as a task body: the lease store from ``BRIDGE_LEASE_DSN`` (worker)
    or from the Airflow plugin's connection (Airflow task)."""
    dsn = os.environ.get("BRIDGE_LEASE_DSN")
    if dsn:
        with LeaseStore(dsn) as store:
            return upstream_result(store, dag_id, task_id, business_date, map_key)
    from airflow_plugins.protection.config import lease_store

    return upstream_result(lease_store(), dag_id, task_id, business_date, map_key)
