"""A protected task whose result JSON cannot hold (a ``Decimal`` total, a ``datetime``), and a
downstream task that fails unless XCom hands it those types (issue 16, item 1b).

Triggered twice for one business date: the second run's protected task does not run its body;
it returns the result the lease recorded, and downstream must see the same types again.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import exactly_once_task

with DAG(
    dag_id="recorded_types",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    tags=["scenario"],
):

    @exactly_once_task(period="day")
    def total(fence: Fence) -> dict[str, Any]:
        """The night's total, as a finance team computes it: a Decimal, and when it was made."""
        return {
            "amount": Decimal("8201.75"),
            "at": datetime(2024, 2, 15, 6, 7, tzinfo=UTC),
            "token": fence.token,
        }

    @task
    def invoice(result: dict[str, Any]) -> str:
        """Fails unless the total arrives as a Decimal and a datetime."""
        if type(result["amount"]) is not Decimal or not isinstance(result["at"], datetime):
            raise TypeError(f"XCom handed {result!r}")
        return f"{result['amount']} at {result['at'].isoformat()} (token {result['token']})"

    invoice(total())
