"""Billing for the same business date is triggered a second time: during the first run, and
again after it finished (manual runs with no logical date, same conf, as an operator does).

Protected and policy-tagged: the second run's task waits for the lease (deferred, no worker
slot), then finds the key succeeded and returns the first run's result without charging; the
third run does the same at once. Plain Airflow charges every customer again, each time.
"""

from __future__ import annotations

import pytest

from tests.e2e.billing_runs import (
    CUSTOMERS,
    PROTECTED,
    TASK,
    UNPROTECTED,
    assert_double_charged,
    assert_exactly_once,
    audit,
    describe_audit,
    finish,
    start_all,
    tally,
    trigger,
    wait_charging,
)
from tests.harness.airflow_harness import AirflowHarness

DELAY = 0.05


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_same_business_date_triggered_during_and_after(airflow: AirflowHarness) -> None:
    airflow.ensure_schedulers()
    first = start_all(airflow, DELAY)
    wait_charging(airflow, first.values(), at_least=20)
    second = {v: trigger(airflow, v, r.business_date, DELAY) for v, r in first.items()}
    finish(airflow, [*first.values(), *second.values()], timeout=300)
    third = {v: trigger(airflow, v, r.business_date, DELAY) for v, r in first.items()}
    final = finish(airflow, third.values(), timeout=300)

    for variant, run in first.items():
        print(f"{variant}: {tally(airflow, run.business_date).summary()}")
    print(describe_audit(audit(airflow, first["protected"])))
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(first, "success")

    for variant in PROTECTED:
        got = assert_exactly_once(airflow, first[variant])
        assert set(got.writers) == {"try1"}
        assert {
            r["writer"].split("/")[0] for r in airflow.charges(first[variant].business_date)
        } == {first[variant].run_id}, "only the first run charged"
        for later in (second[variant], third[variant]):
            result = airflow.client().request(
                "GET",
                f"/api/v2/dags/{later.dag_id}/dagRuns/{later.run_id}/taskInstances/{TASK}"
                "/xcomEntries/return_value",
            )
            assert "340" in str(result["value"]), f"{variant}: later run saw {result}"
    trail = audit(airflow, first["protected"])
    runs_turned_away = {
        (r["holder"] or {}).get("run_id")
        for r in trail
        if r["event"] == "acquire" and r["outcome"] in ("held", "succeeded")
    }
    assert {second["protected"].run_id, third["protected"].run_id} <= runs_turned_away, (
        describe_audit(trail)
    )

    plain = tally(airflow, first["unprotected"].business_date)
    assert plain.rows == 3 * CUSTOMERS, plain.summary()
    for variant in UNPROTECTED:
        assert_double_charged(airflow, first[variant])
