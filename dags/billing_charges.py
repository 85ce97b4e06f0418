"""The billing work of the example DAGs: charge every customer of a business date once.

Not a DAG file (listed in ``.airflowignore``); the billing DAGs import it. The same body runs
protected (a ``Fence`` from the plugin: fenced sink transactions, a ledger of charged customers)
and plain (``Fence.unprotected``: what Airflow does without the plugin), so a comparison between
the two differs only in the protection.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg

from airflow_plugins.fence_context import Fence

SQL = Path(__file__).resolve().parent / "sql"
CUSTOMER_COUNT = 340
SINK_CONN_ID = "billing_db"


def sql(name: str) -> str:
    """The text of ``dags/sql/<name>.sql``."""
    return (SQL / f"{name}.sql").read_text()


def customers(count: int = CUSTOMER_COUNT) -> list[str]:
    """The customers billed every night: ``cust-0001`` .. ``cust-0340``."""
    return [f"cust-{i:04d}" for i in range(1, count + 1)]


def amount_cents(customer: str) -> int:
    """The (deterministic) nightly amount of one customer."""
    return 1000 + int(customer.rsplit("-", 1)[1]) * 37 % 50000


def prepare_sink(dsn: str) -> None:
    """Creates the charges table and the sink fence (idempotent)."""
    from airflow_plugins.lease import SINK_FENCE, migrate

    migrate(dsn, SINK_FENCE)
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute(sql("schema_lock"))  # runs starting together create it once
        conn.execute(sql("billing_schema"))


def _payment_call(delay: float) -> None:
    """Stands for the payment processor's charge call (the real one takes ~40 s a customer)."""
    if delay > 0:
        time.sleep(delay)


def charge_customers(
    fence: Fence, names: list[str], *, delay: float, writer: str
) -> dict[str, Any]:
    """Charges each customer in its own fenced transaction, ``delay`` seconds apart.

    One transaction per customer: claim the customer in the ledger, make the payment call,
    record the charge, commit. A superseded holder is refused at its next transaction (or its
    commit), and a taken-over run skips customers already charged.

    Returns ``charged``: the date's customers charged by any holder of the key (the whole
    night, also after a takeover: what the invoice mail downstream needs), ``charged_now``: by
    this try, ``skipped``: found charged already, ``customers``: how many were to be charged.
    """
    charged = skipped = 0
    for customer in names:
        fence.check()
        with fence.transaction() as tx:
            if tx.claim(customer):
                _payment_call(delay)
                tx.conn.execute(
                    sql("billing_charge"),
                    {
                        "business_date": fence.business_date,
                        "customer": customer,
                        "amount_cents": amount_cents(customer),
                        "token": fence.token,
                        "writer": writer,
                    },
                )
                charged += 1
            else:
                skipped += 1
    # after a takeover this holder did only part of the night: the result that every later
    # run and the downstream tasks are handed counts every holder's charges
    done = set(fence.done_items()) & set(names) if fence.protected else None
    return {
        "charged": charged if done is None else len(done),
        "charged_now": charged,
        "skipped": skipped,
        "customers": len(names),
    }


def charge_unless_charged(
    conn: psycopg.Connection[Any],
    business_date: str,
    names: list[str],
    *,
    delay: float,
    writer: str,
) -> dict[str, Any]:
    """A plain task's resumable billing: charge each customer not yet charged for the date.

    Check, make the payment call, record (autocommit ``conn``): safe to re-run after a crash only
    if no other execution runs at the same time, which is what the cluster policy's one holder
    per key gives a tagged DAG. Two executions at once both see "not charged" and both charge.
    """
    charged = skipped = 0
    for customer in names:
        params = {"business_date": business_date, "customer": customer}
        row = conn.execute(sql("billing_already_charged"), params).fetchone()
        if row and row[0]:
            skipped += 1
            continue
        _payment_call(delay)
        conn.execute(
            sql("billing_charge"),
            {**params, "amount_cents": amount_cents(customer), "token": 0, "writer": writer},
        )
        charged += 1
    return {"charged": charged, "skipped": skipped, "customers": len(names)}
