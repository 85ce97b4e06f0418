"""Task code the bridge tests run: the billing charge written the way the example DAG writes it.

Importable (``tests.bridge.workloads:charge_all``) so a worker process finds it by reference.
"""

from __future__ import annotations

import os
import time
from typing import Any

from airflow_plugins.lease.fence import Fence


def customers(count: int) -> list[str]:
    """The customers to bill."""
    return [f"cust-{n:04d}" for n in range(count)]


def charge_one(tx: Any, fence: Fence, customer: str, cents: int, writer: str) -> None:
    """Charges one customer inside a fenced transaction, once per key."""
    if tx.claim(customer):
        tx.conn.execute(
            "INSERT INTO charges (run_key, customer, token, writer) VALUES (%s, %s, %s, %s)",
            (fence.key.removesuffix("#shadow"), customer, fence.token, f"{writer}:{cents}"),
        )


def charge_all(
    fence: Fence, customers: list[str], delay: float = 0.0, cents: int = 100
) -> dict[str, int]:
    """Charges every customer, one fenced transaction each (a taken-over run skips done ones)."""
    for customer in customers:
        fence.check()
        with fence.transaction() as tx:
            charge_one(tx, fence, customer, cents, "temporal")
        if delay:
            time.sleep(delay)
    return {"charged": len(customers), "cents": cents * len(customers)}


def charge_mapped(fence: Fence, item: str, cents: int = 100) -> dict[str, Any]:
    """Charges one customer (a mapped task: one lease per customer)."""
    with fence.transaction() as tx:
        charge_one(tx, fence, item, cents, "temporal")
    return {"customer": item, "cents": cents}


def total(charged: list[dict[str, Any]]) -> int:
    """Sums a mapped charge's results (Airflow's list, in map index order)."""
    return sum(int(v["cents"]) for v in charged)


def cents_from_env() -> int:
    """The amount the diverging shadow run charges (set per worker)."""
    return int(os.environ.get("BRIDGE_TEST_CENTS", "100"))


def _billing_charges() -> Any:
    import sys
    from pathlib import Path

    dags = str(Path(__file__).resolve().parents[2] / "dags")
    if dags not in sys.path:
        sys.path.insert(0, dags)
    import billing_charges

    return billing_charges


def charge_at_processor(fence: Fence, customers: list[str]) -> dict[str, Any]:
    """The example DAG's charge at the payment processor (``AIRFLOW_CONN_PAYMENT_PROCESSOR``)."""
    result: dict[str, Any] = _billing_charges().charge_at_processor(
        fence, customers, delay=0.0, writer="bridge"
    )
    return result


def charge_around_the_fence(fence: Fence, customers: list[str]) -> dict[str, Any]:
    """Charges with the SDK directly, not through the fence: what a shadow must never do."""
    from airflow_plugins.lease.external_call import OutgoingCall

    bc = _billing_charges()
    send = bc.stripe_sender(bc.stripe_client(bc.payment_api_base()))
    for customer in customers:
        params = bc.charge_params(fence.business_date, customer)
        send(OutgoingCall(fence.key, customer, fence.token, None, params))
    return {"charged": len(customers)}


def charge_item_at_processor(fence: Fence, item: str) -> dict[str, Any]:
    """One customer of a mapped charge task (a lease per customer), at the payment processor."""
    result: dict[str, Any] = _billing_charges().charge_at_processor(
        fence, [item], delay=0.0, writer="bridge"
    )
    return result
