"""The incident: the scheduler running billing dies mid-run and the standby re-runs the task.

Scheduler A owns the four billing runs (B is stopped while they start, then comes back as the
standby). A is killed (SIGKILL, or SIGTERM as a pod eviction sends); its executor's task
processes survive and keep writing. B marks A's job failed after the health-check threshold
(15 s here), resets the "orphaned" task instances and starts try 2 while try 1 may still write.
"""

from __future__ import annotations

import signal

import pytest

from tests.e2e.billing_runs import (
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
    tries,
    wait_charging,
)
from tests.harness.airflow_harness import AirflowHarness

# 340 customers x 0.2 s: try 1 is still charging when B resets it (~20 s after the kill)
DELAY = 0.2


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_owning_scheduler_dies_mid_run(airflow: AirflowHarness, sig: signal.Signals) -> None:
    airflow.ensure_schedulers()
    try:
        airflow.stop_scheduler("scheduler-b")
        runs = start_all(airflow, DELAY)
        first = {}
        for variant, run in runs.items():
            first[variant] = airflow.wait_for_task_processes(run.dag_id, run.run_id, TASK)
            assert airflow.scheduler_name(first[variant].scheduler) == "scheduler-a"
        wait_charging(airflow, runs.values(), at_least=15)
        airflow.start_scheduler("scheduler-b")

        airflow.kill_scheduler("scheduler-a", sig)
        final = finish(airflow, runs.values(), timeout=420)
    finally:  # later tests of the session (any suite) get both schedulers back
        airflow.ensure_schedulers()

    for variant, run in runs.items():
        print(
            f"{variant}: {tries(airflow, run)} tries; {tally(airflow, run.business_date).summary()}"
        )
    for variant in PROTECTED:
        print(f"audit of {runs[variant].key}:\n{describe_audit(audit(airflow, runs[variant]))}")
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for variant in runs:
        assert tries(airflow, runs[variant]) >= 2, f"{variant}: the standby never re-ran it"
    for variant in UNPROTECTED:
        assert_double_charged(airflow, runs[variant])
    for variant in PROTECTED:
        assert_exactly_once(airflow, runs[variant])
    trail = audit(airflow, runs["protected"])
    grants = [r for r in trail if r["outcome"] in ("granted", "taken_over")]
    assert len({r["token"] for r in grants}) >= 2, describe_audit(trail)
    assert len({(r["holder"] or {}).get("try_number") for r in grants}) >= 2
    # the second try's tokens are higher than the first's, and only they wrote after it
    got = tally(airflow, runs["protected"].business_date)
    assert max(got.tokens) == max(r["token"] for r in grants)
