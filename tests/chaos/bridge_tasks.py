"""The task code of the bridge-level campaign's charge, fenced and "plugin disabled".

Importable by reference (``tests.chaos.bridge_tasks:charge_plain``) so a worker process finds
it. ``charge_plain`` charges every customer the way task code does without the plugin: straight
into the sink, one transaction each, without fence, ledger or token, so a retry of an attempt
that charged some customers charges them again. ``charge_fenced`` is the billing charge
(``tests.bridge.workloads``) with a writer that says which engine's run wrote the row, the
primary or its shadow: a shadow's rows are rolled back, so one found in the sink leaked.
"""

from __future__ import annotations

import os
import time

import psycopg

from airflow_plugins.lease.fence import Fence
from airflow_plugins.lease.keys import SHADOW_SUFFIX, lease_key
from tests.bridge.workloads import charge_one


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


def charge_fenced(fence: Fence, customers: list[str], delay: float = 0.0) -> dict[str, int]:
    """Charges every customer, one fenced transaction each; the writer is ``shadow:<pid>`` in a
    shadow run (its transactions are rolled back), ``primary:<pid>`` otherwise."""
    engine = "shadow" if fence.key.endswith(SHADOW_SUFFIX) else "primary"
    for customer in customers:
        fence.check()
        with fence.transaction() as tx:
            charge_one(tx, fence, customer, 100, f"{engine}:{os.getpid()}")
        if delay:
            time.sleep(delay)
    return {"charged": len(customers), "cents": 100 * len(customers)}
