"""The audit page's answer, from real lease-store rows on the real Postgres.

A try whose lease expired is taken over; a duplicate is blocked while the lease is held and
another after it succeeded; the superseded try's late completion is refused. The answer must
still be "exactly once", with every try, token, holder, input and output as stored.
"""

from __future__ import annotations

import time
from datetime import date

import pytest

from airflow_plugins.lease import Holder, LeaseLost, LeaseStore
from airflow_plugins.views.audit_answer import Verdict
from airflow_plugins.views.pages import audit_page

DAY = "2024-02-15"
KEY = f"billing_nightly/charge/{DAY}"


def _holder(try_number: int) -> Holder:
    return Holder.airflow(
        dag_id="billing_nightly",
        run_id="scheduled__2024-02-15T02:00:00+00:00",
        task_id="charge",
        try_number=try_number,
    )


def test_a_taken_over_run_with_blocked_duplicates_ran_exactly_once(store: LeaseStore) -> None:
    today = date.today()
    first = store.acquire(KEY, _holder(1), ttl=0.5, business_date=today, input={"customers": 340})
    assert first.granted
    blocked = store.acquire(KEY, _holder(9), business_date=today)
    assert blocked.outcome == "held"
    deadline = time.monotonic() + 30
    while True:
        second = store.acquire(
            KEY, _holder(2), ttl=30, business_date=today, input={"customers": 340}
        )
        if second.granted or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert second.outcome == "taken_over"
    store.complete(second.lease, {"charged": 340})
    with pytest.raises(LeaseLost):
        store.complete(first.lease, {"charged": 12})
    after = store.acquire(KEY, _holder(3), business_date=today)
    assert after.outcome == "succeeded"

    result, chart = audit_page(store, "billing_nightly", DAY, 1000)

    assert result.verdict is Verdict.EXACTLY_ONCE
    [key] = result.keys
    assert key.key == KEY
    assert key.completions == 1
    assert key.blocked >= 2  # the held duplicate(s) and the one after success
    assert [t.token for t in key.tries] == [first.token, second.token]
    assert [t.outcome for t in key.tries] == ["superseded", "succeeded"]
    assert key.tries[0].input == {"customers": 340}
    assert key.tries[1].output == {"charged": 340}
    assert key.tries[1].duration_ms is not None
    assert "billing_nightly.charge" in key.tries[1].holder
    assert "try 2" in key.tries[1].holder
    assert chart.startswith("<svg")
    assert chart.count("<rect") == 2  # one bar per try


def test_a_date_with_no_run_is_answered_not_run(store: LeaseStore) -> None:
    result, _ = audit_page(store, "billing_nightly", "2024-02-16", 1000)
    assert result.verdict is Verdict.NOT_RUN
    assert result.keys == []


def test_hourly_keys_of_a_day_and_shadow_keys_are_told_apart(store: LeaseStore) -> None:
    holder = Holder.process("rollup")
    for hour in ("00", "01"):
        got = store.acquire(f"rollup_hourly/aggregate/{DAY}T{hour}", holder)
        store.complete(got.lease, {"hour": hour})
    shadow = store.acquire(f"rollup_hourly/aggregate/{DAY}T02#shadow", holder)
    store.complete(shadow.lease, {"hour": "02"})
    running = store.acquire(f"rollup_hourly/aggregate/{DAY}T03", holder)
    assert running.granted

    result, _ = audit_page(store, "rollup_hourly", DAY, 1000)

    assert [k.key.split("/")[2] for k in result.keys] == [
        f"{DAY}T00",
        f"{DAY}T01",
        f"{DAY}T02#shadow",
        f"{DAY}T03",
    ]
    assert [k.shadow for k in result.keys] == [False, False, True, False]
    assert result.verdict is Verdict.RUNNING  # T03 is still running; the shadow does not count
