"""The task code of the bridge-level campaign's "plugin disabled" variant.

Importable by reference (``tests.chaos.bridge_tasks:charge_plain``) so a worker process finds
it. It charges every customer the way task code does without the plugin: straight into the sink,
one transaction each, without fence, ledger or token, so a retry of an attempt that charged some
customers charges them again. The fenced variant runs ``tests.bridge.workloads:charge_all``.
"""

from __future__ import annotations

import os
import time

import psycopg

from airflow_plugins.lease.keys import lease_key


def charge_plain(
    dag_id: str, business_date: str, customers: list[str], delay: float = 0.0
) -> dict[str, int]:
    """Charges each customer once per call, with no fence: what a task without the plugin does."""
    key = str(lease_key(dag_id, "charge", business_date))
    # the same Airflow connection variable the fenced code reads (a URI)
    dsn = os.environ["AIRFLOW_CONN_BILLING_DB"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for customer in customers:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO charges (run_key, customer, token, writer) VALUES (%s, %s, 0, %s)",
                    (key, customer, f"plain:{os.getpid()}"),
                )
            if delay:
                time.sleep(delay)
    return {"charged": len(customers), "cents": 100 * len(customers)}
