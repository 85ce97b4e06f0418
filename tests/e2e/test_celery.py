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
scenario says which of Airflow's checks did it: a message re-delivered while its try runs (it
outlived the visibility timeout) is turned away by the API server's 409 on starting a task
instance that is no longer queued (Celery provider: "Task already running elsewhere").
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
    BillingRun,
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
from tests.harness.airflow_harness import pid_alive, signal_pids, wait_for
from tests.harness.celery_harness import CeleryHarness, celery_airflow

__all__ = ["celery_airflow"]

pytestmark = [pytest.mark.celery]

# The slow variants are written and reviewed, not yet run green here: the machine's heavy lock
# stayed busy until the deadline. Remove the mark after one green run of
#   flock /tmp/eo-heavy.lock .venv/bin/python -m pytest tests/e2e/test_celery.py -q
NOT_YET_RUN = pytest.mark.skip(reason="not yet run green on this machine (see NOT_YET_RUN)")


@pytest.fixture
def celery(celery_airflow: CeleryHarness) -> Iterator[CeleryHarness]:
    """The module's Celery stack, both schedulers and both workers running around each test."""
    celery_airflow.ensure_schedulers()
    celery_airflow.ensure_workers()
    yield celery_airflow
    celery_airflow.ensure_workers()


def _report(airflow: CeleryHarness, runs: dict[str, BillingRun]) -> None:
    for variant, run in runs.items():
        print(
            f"{variant}: {tries(airflow, run)} tries; {tally(airflow, run.business_date).summary()}"
        )
    for variant in PROTECTED:
        print(f"audit of {runs[variant].key}:\n{describe_audit(audit(airflow, runs[variant]))}")


def _grant_workers(airflow: CeleryHarness, run: BillingRun) -> dict[int, str | None]:
    """Try number -> the Celery worker named by the holder its lease was granted to."""
    return {
        (r["holder"] or {}).get("try_number"): (r["holder"] or {}).get("worker")
        for r in audit(airflow, run)
        if r["event"] == "acquire" and r["outcome"] in ("granted", "taken_over")
    }


def _queued(airflow: CeleryHarness, run: BillingRun) -> bool:
    """True when a task instance of ``run`` is queued (its message waits in the broker)."""
    return any(
        ti.get("state") == "queued"
        for ti in airflow.client().task_instances(run.dag_id, run.run_id)
    )


def _on_worker_a(airflow: CeleryHarness, delay: float) -> dict[str, BillingRun]:
    """Starts the four runs with only worker-a consuming; returns once all four run there
    (worker-b is running again on return)."""
    airflow.stack.stop_component("worker-b", timeout=20.0)
    try:
        runs = start_all(airflow, delay)
        for run in runs.values():
            procs = airflow.wait_for_task_processes(run.dag_id, run.run_id, TASK)
            assert airflow.worker_of(procs) == "worker-a"
    finally:
        airflow.restart_worker("worker-b")
    return runs


def test_billing_run_on_celery_workers(celery: CeleryHarness) -> None:
    """The plain billing run on two Celery workers: every variant charges each customer once,
    and the protected holders name the Celery worker they ran on."""
    runs = start_all(celery, 0.05)
    final = finish(celery, runs.values(), timeout=300)
    _report(celery, runs)
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for run in runs.values():
        assert_exactly_once(celery, run)
        assert tries(celery, run) == 1
    nodes = {celery.celery.node_name(w) for w in celery.stack.workers}
    for variant in PROTECTED:
        workers = _grant_workers(celery, runs[variant])
        assert workers[1] in nodes, f"the holder does not name its Celery worker: {workers}"


@NOT_YET_RUN
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_task_outliving_the_visibility_timeout_is_redelivered_while_it_runs(
    celery: CeleryHarness,
) -> None:
    """Each try runs ~150 s, longer than the visibility timeout (30 s) plus kombu's restore
    period (it looks for expired unacknowledged messages every 10th tick of 10 s, so every
    100 s): Redis hands the message out again while the try runs. Airflow's own check turns the
    copy away (the API server refuses to start a task instance that is no longer queued; the
    provider logs "Task already running elsewhere"), so no variant charges twice, the plain
    ones included: this road is closed by Airflow 3.3 itself, the lease is not what closes it."""
    runs = start_all(celery, 150 / CUSTOMERS)
    final = finish(celery, runs.values(), timeout=480)
    _report(celery, runs)
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for run in runs.values():
        assert_exactly_once(celery, run)
    logs = "".join(
        (celery.stack.home / f"{w}.log").read_text(errors="replace") for w in celery.stack.workers
    )
    assert "Task already running elsewhere" in logs, "no message was re-delivered"


@pytest.mark.timeout(600)
def test_worker_killed_mid_task_is_redelivered(celery: CeleryHarness) -> None:
    """Worker-a and every process it runs are SIGKILLed mid-run (its machine is lost). Its
    messages were not acknowledged (``task_acks_late``): Redis hands them out again after the
    visibility timeout, and the scheduler fails the silent tries after the task heartbeat
    timeout and retries them on worker-b. Plain Airflow's new try re-charges from the first
    customer; the protected try takes the lease over and skips what the ledger holds."""
    runs = _on_worker_a(celery, delay=0.1)
    wait_charging(celery, runs.values(), at_least=30)
    celery.signal_worker("worker-a", signal.SIGKILL)
    final = finish(celery, runs.values(), timeout=420)
    _report(celery, runs)

    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for run in runs.values():
        assert tries(celery, run) >= 2, f"{run.variant}: the lost try was never run again"
    assert_double_charged(celery, runs["unprotected"])
    for variant in PROTECTED:
        assert_exactly_once(celery, runs[variant])
    # the resumable plain task is right here: the lost try died with its worker, no overlap
    assert tally(celery, runs["untagged"].business_date).missing == 0
    workers = _grant_workers(celery, runs["protected"])
    a, b = (celery.celery.node_name(w) for w in ("worker-a", "worker-b"))
    assert workers[1] == a, describe_audit(audit(celery, runs["protected"]))
    assert b in workers.values(), describe_audit(audit(celery, runs["protected"]))


@pytest.mark.timeout(600)
def test_frozen_worker_past_its_lease_is_refused_after_resume(celery: CeleryHarness) -> None:
    """Worker-a and everything it runs are SIGSTOPped past the lease (10 s) and the task
    heartbeat timeout (20 s): Airflow fails the tries, worker-b runs try 2 with a higher token;
    then worker-a is resumed. No write of the resumed old try gets through the protected sink."""
    runs = _on_worker_a(celery, delay=0.1)
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
    _report(celery, runs)

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
    workers = _grant_workers(celery, runs["protected"])
    assert workers[1] == celery.celery.node_name("worker-a"), workers
    assert workers[2] == celery.celery.node_name("worker-b"), workers


@NOT_YET_RUN
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_running_task_cleared_on_celery(celery: CeleryHarness) -> None:
    """The UI's Clear on the running billing tasks: Airflow ends the old tries (their
    supervisors learn it at the next heartbeat) and queues new ones. Plain Airflow re-charges
    what the first try charged; the protected try skips it."""
    runs = start_all(celery, 0.1)
    for run in runs.values():
        celery.wait_for_task_processes(run.dag_id, run.run_id, TASK)
    wait_charging(celery, runs.values(), at_least=40)
    for run in runs.values():
        celery.clear_task(run.dag_id, run.run_id, TASK)
    final = finish(celery, runs.values(), timeout=360)
    _report(celery, runs)
    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    assert_double_charged(celery, runs["unprotected"])
    for variant in (*PROTECTED, "untagged"):  # untagged: no overlap, so it resumes right
        assert_exactly_once(celery, runs[variant])


@NOT_YET_RUN
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_same_business_date_triggered_twice_on_celery(celery: CeleryHarness) -> None:
    """A second run of the same business date triggered during the first: the protected
    task waits for the lease and returns the first run's result; plain Airflow charges again."""
    first = start_all(celery, 0.05)
    wait_charging(celery, first.values(), at_least=20)
    second = {v: trigger(celery, v, r.business_date, 0.05) for v, r in first.items()}
    final = finish(celery, [*first.values(), *second.values()], timeout=360)
    _report(celery, first)
    assert all(r["state"] == "success" for r in final.values())
    for variant in PROTECTED:
        assert_exactly_once(celery, first[variant])
    assert tally(celery, first["unprotected"].business_date).rows == 2 * CUSTOMERS
    for variant in UNPROTECTED:
        assert_double_charged(celery, first[variant])


@pytest.mark.timeout(600)
def test_redis_restarted_mid_run_loses_no_customer(celery: CeleryHarness) -> None:
    """Redis is restarted while four tries run on worker-a and four more wait in its queue.
    This Redis keeps nothing on disk, so the queued messages are gone; the scheduler queues
    those task instances again after ``task_queued_timeout`` (30 s here, 600 s by default).
    Nothing is charged twice by any variant (a lost message runs nowhere) and no customer is
    missed: the road here is a missing run, which Airflow's queued timeout brings back."""
    celery.stack.stop_component("worker-b", timeout=20.0)
    try:
        running = start_all(celery, 0.1)
        for run in running.values():
            celery.wait_for_task_processes(run.dag_id, run.run_id, TASK)
        queued = start_all(celery, 0.02)
        for run in queued.values():  # its first task waits in Redis (billing_nightly: prepare)
            wait_for(
                lambda run=run: _queued(celery, run),
                timeout=120,
                what=f"a task of {run.variant} to wait in the broker",
            )
        wait_charging(celery, running.values(), at_least=20)
        celery.redis.restart()
    finally:
        celery.restart_worker("worker-b")
    runs = [*running.values(), *queued.values()]
    final = finish(celery, runs, timeout=420)
    for run in runs:
        got = tally(celery, run.business_date)
        print(f"{run.variant}: {tries(celery, run)} tries; {got.summary()}")
    assert all(r["state"] == "success" for r in final.values()), final
    for run in runs:
        assert_exactly_once(celery, run)
