"""A manual run cannot pre-claim the future: a conf business date whose period has not begun.

A run for tomorrow (or 2099-12-31) would take the key, and the real scheduled run of that date
would then be handed "already succeeded". The business date is refused, with an error that says
so, unless the DAG declares that it allows future dates.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from airflow_plugins.lease import LeaseStore
from airflow_plugins.protection.operators import ExactlyOnceOperator
from tests.airflow.conftest import task_context


def _operator(
    body: Any, *, schedule: str = "0 2 * * *", tz: str = "UTC", tags: list[str] | None = None
) -> ExactlyOnceOperator:
    with DAG(
        "billing_nightly",
        schedule=schedule,
        start_date=pendulum.datetime(2024, 1, 1, tz=tz),
        tags=tags or [],
    ):
        return ExactlyOnceOperator(task_id="charge", python_callable=body)


class Body:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fence: Any) -> dict[str, str]:
        self.calls += 1
        return {"charged": fence.business_date}


def _manual(op: ExactlyOnceOperator, business_date: str) -> dict[str, Any]:
    return task_context(
        op, run_id=f"manual__{business_date}", conf={"business_date": business_date}
    )


def _today(tz: str) -> datetime:
    return datetime.now(UTC).astimezone(ZoneInfo(tz))


def test_a_manual_run_for_a_day_not_begun_is_refused_and_claims_nothing(
    plugin_env: dict[str, str],
) -> None:
    body = Body()
    op = _operator(body)
    tomorrow = (_today("UTC") + timedelta(days=1)).strftime("%Y-%m-%d")
    for future in (tomorrow, "2099-12-31"):
        with pytest.raises(AirflowFailException, match=f"business_date {future!r}.*not begun"):
            op.execute(_manual(op, future))
    assert body.calls == 0
    with LeaseStore(plugin_env["lease"]) as store:
        assert store.get(f"billing_nightly/charge/{tomorrow}") is None
        assert store.get("billing_nightly/charge/2099-12-31") is None


def test_an_hour_not_begun_is_refused_in_the_dags_timezone(plugin_env: dict[str, str]) -> None:
    body = Body()
    op = _operator(body, schedule="@hourly", tz="Asia/Kolkata")
    later = (_today("Asia/Kolkata") + timedelta(hours=1)).strftime("%Y-%m-%dT%H")
    with pytest.raises(AirflowFailException, match="not begun"):
        op.execute(_manual(op, later))
    assert body.calls == 0


def test_the_current_period_and_the_past_may_be_named(plugin_env: dict[str, str]) -> None:
    body = Body()
    # Kiritimati is UTC+14: its today is often tomorrow in UTC, and has begun there
    op = _operator(body, tz="Pacific/Kiritimati")
    today = _today("Pacific/Kiritimati").strftime("%Y-%m-%d")
    assert op.execute(_manual(op, today)) == {"charged": today}
    assert op.execute(_manual(op, "2024-02-15")) == {"charged": "2024-02-15"}
    assert body.calls == 2


def test_a_dag_that_declares_future_dates_may_run_ahead(plugin_env: dict[str, str]) -> None:
    from airflow_plugins.lease.keys import ALLOW_FUTURE_TAG

    body = Body()
    op = _operator(body, tags=[ALLOW_FUTURE_TAG])
    assert op.execute(_manual(op, "2099-12-31")) == {"charged": "2099-12-31"}
    assert body.calls == 1
