"""The billing task's supervisor and task process are paused (SIGSTOP) past the lease TTL
(10 s) and Airflow's task heartbeat timeout (20 s); Airflow fails the try and a new try takes
over; then the old processes are resumed.

Protected: the new try takes the lease over with a higher token and raises the sink's fence;
every write the resumed old process attempts is refused (no row of the old try after resume).
Policy-tagged: the resumed process finds its lease lost and kills itself (self-fencing); it has
no sink fence, so what it does between resuming and its keeper noticing is not refused: the
README promises at most the write in flight then.
"""

from __future__ import annotations

import signal
from datetime import UTC, datetime

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
from tests.harness.airflow_harness import AirflowHarness, pid_alive, signal_pids, wait_for

DELAY = 0.1


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_paused_holder_is_refused_after_takeover(airflow: AirflowHarness) -> None:
    airflow.ensure_schedulers()
    runs = start_all(airflow, DELAY)
    old = {v: airflow.wait_for_task_processes(r.dag_id, r.run_id, TASK) for v, r in runs.items()}
    wait_charging(airflow, runs.values(), at_least=30)

    paused = [pid for p in old.values() for pid in (p.supervisor, p.task)]
    signal_pids(paused, signal.SIGSTOP)
    try:
        for run in runs.values():  # a new try starts and charges while the old one is frozen
            airflow.wait_for_task_processes(run.dag_id, run.run_id, TASK, min_try=2, timeout=150)
        for run in runs.values():
            wait_for(
                lambda run=run: tally(airflow, run.business_date).writers.get("try2", 0) >= 5,
                timeout=120,
                what=f"{run.variant}'s try 2 to charge",
            )
    finally:
        resumed_at = datetime.now(UTC)
        signal_pids(paused, signal.SIGCONT)
    wait_for(
        lambda: not any(pid_alive(p.task) for p in old.values()),
        timeout=60,
        what="the resumed old task processes to end",
    )
    final = finish(airflow, runs.values(), timeout=300)

    after: dict[str, int] = {}
    for variant, run in runs.items():
        rows = airflow.charges(run.business_date)
        after[variant] = sum(
            1 for r in rows if r["writer"].endswith("/try1") and r["charged_at"] >= resumed_at
        )
        got = tally(airflow, run.business_date)
        print(
            f"{variant}: {tries(airflow, run)} tries; {got.summary()}; old try wrote "
            f"{after[variant]} after resume"
        )
    print(describe_audit(audit(airflow, runs["protected"])))
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")

    assert_exactly_once(airflow, runs["protected"])
    assert after["protected"] == 0, "a write of the superseded holder got through"
    # the audit trail: try 1's lease ended (Airflow failed the try on its heartbeat timeout and
    # the listener failed the lease on its behalf, or the lease expired and was taken over) and
    # try 2 holds a higher token
    trail = audit(airflow, runs["protected"])
    grants = {
        (r["holder"] or {}).get("try_number"): r["token"]
        for r in trail
        if r["event"] == "acquire" and r["outcome"] in ("granted", "taken_over")
    }
    assert grants.get(2, 0) > grants.get(1, 0) > 0, describe_audit(trail)
    assert any(
        r["outcome"] in ("failed", "taken_over") and r["token"] == grants[1] for r in trail
    ), describe_audit(trail)
    old_log = airflow.task_log(runs["protected"].dag_id, runs["protected"].run_id, TASK, 1)
    refusals = ("StaleToken", "IdleInTransactionSessionTimeout", "is no longer held")
    assert any(r in old_log for r in refusals), "try 1's log shows no refused write:\n" + "\n".join(
        old_log.splitlines()[-15:]
    )

    assert_double_charged(airflow, runs["unprotected"])

    tagged = tally(airflow, runs["tagged"].business_date)
    assert tagged.missing == 0, tagged.summary()
    assert after["tagged"] <= 1, "self-fencing let more than the write in flight through"
    assert tagged.double_charged <= 1, tagged.summary()
    assert_double_charged(airflow, runs["untagged"])
