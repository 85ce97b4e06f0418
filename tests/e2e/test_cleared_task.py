"""The running billing task is cleared mid-run (the UI's Clear on a running task).

Airflow tells the running try to stop (its supervisor's next heartbeat learns the task
instance is no longer running; SIGTERM, then SIGKILL 5 s later) and schedules a new try, which
starts over. Plain Airflow re-charges every customer the first try had charged; the protected
task's new try skips them (the sink's ledger), the policy-tagged one waits for the lease.
"""

from __future__ import annotations

import pytest

from tests.e2e.billing_runs import (
    TASK,
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

DELAY = 0.1


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_running_billing_task_cleared_mid_run(airflow: AirflowHarness) -> None:
    airflow.ensure_schedulers()
    runs = start_all(airflow, DELAY)
    for run in runs.values():
        airflow.wait_for_task_processes(run.dag_id, run.run_id, TASK)
    wait_charging(airflow, runs.values(), at_least=40)

    for run in runs.values():
        airflow.clear_task(run.dag_id, run.run_id, TASK)
    final = finish(airflow, runs.values(), timeout=360)

    for variant, run in runs.items():
        print(
            f"{variant}: {tries(airflow, run)} tries; {tally(airflow, run.business_date).summary()}"
        )
    print(describe_audit(audit(airflow, runs["protected"])))
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for run in runs.values():
        assert tries(airflow, run) >= 2, f"{run.variant}: the clear did not start a new try"
    assert_double_charged(airflow, runs["unprotected"])
    assert_exactly_once(airflow, runs["protected"])
    assert_exactly_once(airflow, runs["tagged"])
    # The resumable plain task is right here too: Airflow ends the old try before the new one
    # starts, so clearing alone makes no overlap; the harm of a clear is re-doing work.
    assert_exactly_once(airflow, runs["untagged"])
    got = tally(airflow, runs["protected"].business_date)
    assert len(got.writers) >= 2, "both tries charged (the second skipped the first's customers)"
