"""The guarantee on CeleryExecutor: real ``airflow celery worker`` processes, a real Redis broker.

One stack for the module (``tests.harness.celery_harness``): two schedulers, workers
``worker-a`` and ``worker-b`` (6 slots each), Redis as broker with a 30 s visibility timeout,
the metadata database as Celery's result backend. Each scenario runs the four billing variants
of ``tests.e2e.billing_runs`` at once (protected, its unprotected twin, policy-tagged and plain)
and counts the rows in the billing database: 340 customers, each charged exactly once.

Where a scenario needs its tries on one worker, the other worker is stopped while they start
(6 slots: the four tries and the other tasks of their runs fit on worker-a), then started
again to take over.

Where Airflow itself prevents the duplicate, the unprotected twin is asserted right too and the
scenario says which of Airflow's checks did it: a cleared try ends before its new try is queued
(the resumable plain task re-does work but charges nobody twice); a broker restart loses
queued messages, so nothing runs twice. A message re-delivered while its try runs (it outlived
the visibility timeout) is not closed by Airflow: the copy is refused, but the scheduler takes
its failure for the running try and retries it (``test_celery_redelivery.py``); this stack runs
with the plugin's Celery settings, which ignore the refused copy.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import UTC, datetime

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
    tries,
    trigger,
    wait_charging,
)
from tests.e2e.celery_scenarios import (
    broker_restarted_mid_run,
    grant_workers,
    on_worker_a,
    report,
    worker_killed_mid_task,
)
from tests.harness.airflow_harness import pid_alive, signal_pids, wait_for
from tests.harness.celery_harness import CeleryHarness, celery_airflow, each_test

__all__ = ["celery_airflow"]

pytestmark = [pytest.mark.celery]


@pytest.fixture
def celery(celery_airflow: CeleryHarness) -> Iterator[CeleryHarness]:
    """The module's Celery stack, both schedulers and both workers running around each test."""
    yield from each_test(celery_airflow)


def test_billing_run_on_celery_workers(celery: CeleryHarness) -> None:
    """The plain billing run on two Celery workers: every variant charges each customer once,
    and the protected holders name the Celery worker they ran on."""
    runs = start_all(celery, 0.05)
    final = finish(celery, runs.values(), timeout=300)
    report(celery, runs)
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for run in runs.values():
        assert_exactly_once(celery, run)
        assert tries(celery, run) == 1
    nodes = {celery.celery.node_name(w) for w in celery.stack.workers}
    for variant in PROTECTED:
        workers = grant_workers(celery, runs[variant])
        assert workers[1] in nodes, f"the holder does not name its Celery worker: {workers}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_task_outliving_the_visibility_timeout_is_redelivered_while_it_runs(
    celery: CeleryHarness,
) -> None:
    """Each try runs ~150 s, longer than the visibility timeout (30 s) plus kombu's restore
    period (it looks for expired unacknowledged messages every 10th tick of 10 s, so every
    100 s): Redis hands the message out again while the try runs. The API server refuses the
    copy's start (its workload token lived ``task_queued_timeout``, 30 s here: a 403), and the
    plugin's Celery settings (``protection.celery_config``, on in this stack as in the docker
    stack) make the refused copy end as ``Ignore``: no failure is recorded against the running
    try, which runs to its end, once. Without them each try is failed by its copy
    (``test_celery_redelivery.py``)."""
    runs = start_all(celery, 150 / CUSTOMERS)
    final = finish(celery, runs.values(), timeout=420)
    report(celery, runs)
    logs = celery.worker_logs()
    ignored = logs.count("re-delivered message refused at start")
    ignored += logs.count("Task already running elsewhere")
    print(f"re-delivered copies ignored: {ignored}")
    assert ignored > 0, "no message was re-delivered while its try ran"
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for run in runs.values():
        assert tries(celery, run) == 1, f"{run.variant}: a copy failed the running try"
        assert_exactly_once(celery, run)


@pytest.mark.timeout(600)
def test_worker_killed_mid_task_is_redelivered(celery: CeleryHarness) -> None:
    """Worker-a SIGKILLed mid-run with Redis as broker (``celery_scenarios``); Redis hands its
    unacknowledged messages out again after the visibility timeout."""
    worker_killed_mid_task(celery)


@pytest.mark.timeout(600)
def test_frozen_worker_past_its_lease_is_refused_after_resume(celery: CeleryHarness) -> None:
    """Worker-a and everything it runs are SIGSTOPped past the lease (10 s) and the task
    heartbeat timeout (20 s): Airflow fails the tries, worker-b runs try 2 with a higher token;
    then worker-a is resumed. No write of the resumed old try gets through the protected sink."""
    runs = on_worker_a(celery, delay=0.1)
    old = {v: celery.wait_for_task_processes(r.dag_id, r.run_id, TASK) for v, r in runs.items()}
    wait_charging(celery, runs.values(), at_least=30)
    frozen = celery.signal_worker("worker-a", signal.SIGSTOP)
    try:
        for run in runs.values():
            celery.wait_for_task_processes(run.dag_id, run.run_id, TASK, min_try=2, timeout=150)
        for run in runs.values():
            wait_for(
                lambda run=run: tally(celery, run.business_date).writers.get("try2", 0) >= 5,
                timeout=120,
                what=f"{run.variant}'s try 2 to charge",
            )
    finally:
        resumed_at = datetime.now(UTC)
        signal_pids(frozen, signal.SIGCONT)
    wait_for(
        lambda: not any(pid_alive(p.task) for p in old.values()),
        timeout=90,
        what="the resumed old task processes to end",
    )
    final = finish(celery, runs.values(), timeout=300)
    report(celery, runs)

    after = {
        v: sum(
            1
            for r in celery.charges(run.business_date)
            if r["writer"].endswith("/try1") and r["charged_at"] >= resumed_at
        )
        for v, run in runs.items()
    }
    print(f"old tries' writes after resume: {after}")
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    assert_exactly_once(celery, runs["protected"])
    assert after["protected"] == 0, "a write of the superseded holder got through"
    assert_double_charged(celery, runs["unprotected"])
    assert_double_charged(celery, runs["untagged"])
    tagged = tally(celery, runs["tagged"].business_date)
    assert tagged.missing == 0, tagged.summary()
    assert after["tagged"] <= 1, "self-fencing let more than the write in flight through"
    workers = grant_workers(celery, runs["protected"])
    assert workers[1] == celery.celery.node_name("worker-a"), workers
    assert workers[2] == celery.celery.node_name("worker-b"), workers


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_running_task_cleared_on_celery(celery: CeleryHarness) -> None:
    """The UI's Clear on the running billing tasks: Airflow ends the old tries (their
    supervisors learn it at the next heartbeat) and queues new ones, which a Celery worker
    picks up. Plain Airflow re-charges what the first try charged; the protected try skips it
    (the sink's ledger), the policy-tagged one waits for the lease. Airflow itself prevents the
    overlap: the new try is queued only once the old one ended, so the resumable plain task
    (untagged) is right; the harm a clear does to it is re-doing work, not doing it twice."""
    runs = start_all(celery, 0.1)
    for run in runs.values():
        celery.wait_for_task_processes(run.dag_id, run.run_id, TASK)
    wait_charging(celery, runs.values(), at_least=40)
    for run in runs.values():
        celery.clear_task(run.dag_id, run.run_id, TASK)
    final = finish(celery, runs.values(), timeout=360)
    report(celery, runs)
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for run in runs.values():
        assert tries(celery, run) >= 2, f"{run.variant}: the clear did not start a new try"
    assert_double_charged(celery, runs["unprotected"])
    for variant in (*PROTECTED, "untagged"):
        assert_exactly_once(celery, runs[variant])
    got = tally(celery, runs["protected"].business_date)
    assert len(got.writers) >= 2, f"the new try charged nothing: {got.summary()}"
    nodes = {celery.celery.node_name(w) for w in celery.stack.workers}
    for variant in PROTECTED:
        workers = grant_workers(celery, runs[variant])
        assert set(workers) >= {1, 2}, describe_audit(audit(celery, runs[variant]))
        assert set(workers.values()) <= nodes, f"{variant}: holders {workers}"


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_same_business_date_triggered_twice_on_celery(celery: CeleryHarness) -> None:
    """A second run of the same business date triggered during the first: the protected
    task's acquire is ``held`` (it defers, freeing its worker slot), then finds the key
    succeeded and returns the first run's result without charging. Plain Airflow charges every
    customer again: two DAG runs are two task instances, none of Airflow's checks relates them.
    The first runs' tries run on worker-a; it is then drained (it stops taking tasks) so that
    every try of the second runs is on worker-b: the audit names a holder on each worker."""
    first = on_worker_a(celery, 0.05)
    wait_charging(celery, first.values(), at_least=20)
    celery.consume("worker-a", on=False)
    try:
        second = {v: trigger(celery, v, r.business_date, 0.05) for v, r in first.items()}
        final = finish(celery, [*first.values(), *second.values()], timeout=360)
    finally:
        celery.consume("worker-a", on=True)
    report(celery, first)
    assert all(r["state"] == "success" for r in final.values()), final
    a, b = (celery.celery.node_name(w) for w in ("worker-a", "worker-b"))
    for variant in PROTECTED:
        got = assert_exactly_once(celery, first[variant])
        assert set(got.writers) == {"try1"}, got.summary()
        writers = {r["writer"].split("/")[0] for r in celery.charges(first[variant].business_date)}
        assert writers == {first[variant].run_id}, f"{variant}: not only the first run charged"
        trail = audit(celery, first[variant])
        acquires = [r for r in trail if r["event"] == "acquire"]
        second_run = second[variant].run_id
        by_run = {(r["holder"] or {}).get("run_id") for r in acquires}
        assert {first[variant].run_id, second_run} <= by_run, describe_audit(trail)
        turned_away = {r["outcome"] for r in acquires if r["holder"]["run_id"] == second_run}
        assert turned_away & {"held", "succeeded"}, describe_audit(trail)
        workers = {
            run_id: {
                (r["holder"] or {}).get("worker")
                for r in acquires
                if r["holder"]["run_id"] == run_id
            }
            for run_id in (first[variant].run_id, second_run)
        }
        print(f"{variant}: holders by run {workers}")
        assert workers[first[variant].run_id] == {a}, describe_audit(trail)
        assert workers[second_run] == {b}, describe_audit(trail)
    plain = tally(celery, first["unprotected"].business_date)
    assert plain.rows == 2 * CUSTOMERS, plain.summary()
    for variant in UNPROTECTED:
        assert_double_charged(celery, first[variant])


@pytest.mark.timeout(600)
def test_redis_restarted_mid_run_loses_no_customer(celery: CeleryHarness) -> None:
    """Redis is restarted mid-run (``celery_scenarios.broker_restarted_mid_run``). This Redis
    keeps nothing on disk, so the queued messages are gone; the scheduler queues
    those task instances again after ``task_queued_timeout`` (30 s here, 600 s by default).
    Nothing is charged twice by any variant (a lost message runs nowhere) and no customer is
    missed: the road here is a missing run, which Airflow's queued timeout brings back."""
    for run in broker_restarted_mid_run(celery):
        assert_exactly_once(celery, run)
