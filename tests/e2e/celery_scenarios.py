"""The Celery scenarios where the broker matters, shared by the Redis and RabbitMQ modules.

``tests/e2e/test_celery.py`` runs them on Redis (in CI), ``tests/e2e/test_celery_rabbitmq.py``
on RabbitMQ (``slow``). Each takes a ``CeleryHarness`` whose both workers run, starts the four
billing variants of ``tests.e2e.billing_runs`` and applies the fault; the assertions the two
brokers share are here, the ones that differ stay in the test.
"""

from __future__ import annotations

import signal

from tests.e2e.billing_runs import (
    PROTECTED,
    TASK,
    BillingRun,
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
from tests.harness.airflow_harness import wait_for
from tests.harness.celery_harness import CeleryHarness


def report(airflow: CeleryHarness, runs: dict[str, BillingRun]) -> None:
    """Prints each variant's tries and tally, and the protected variants' audit trails."""
    for variant, run in runs.items():
        print(
            f"{variant}: {tries(airflow, run)} tries; {tally(airflow, run.business_date).summary()}"
        )
    for variant in PROTECTED:
        print(f"audit of {runs[variant].key}:\n{describe_audit(audit(airflow, runs[variant]))}")


def grant_workers(airflow: CeleryHarness, run: BillingRun) -> dict[int, str | None]:
    """Try number -> the Celery worker named by the holder its lease was granted to."""
    return {
        (r["holder"] or {}).get("try_number"): (r["holder"] or {}).get("worker")
        for r in audit(airflow, run)
        if r["event"] == "acquire" and r["outcome"] in ("granted", "taken_over")
    }


def dispatched(airflow: CeleryHarness, run: BillingRun) -> bool:
    """True once a task instance of ``run`` was handed to the executor (queued, or past it)."""
    return any(
        ti.get("state") in ("queued", "running", "success")
        for ti in airflow.client().task_instances(run.dag_id, run.run_id)
    )


def on_worker_a(airflow: CeleryHarness, delay: float) -> dict[str, BillingRun]:
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


def worker_killed_mid_task(celery: CeleryHarness) -> None:
    """Worker-a and every process it runs are SIGKILLed mid-run (its machine is lost); its
    messages were not acknowledged (``task_acks_late``), so the broker hands them out again
    (Redis after the visibility timeout, RabbitMQ once the dead worker's connection closes),
    and Airflow refuses those copies: the try is still running in its database. The scheduler
    fails the silent tries after the task heartbeat timeout and retries them on worker-b. Plain
    Airflow's new try re-charges from the first customer; the protected try takes the lease
    over and skips what the ledger holds."""
    runs = on_worker_a(celery, delay=0.1)
    wait_charging(celery, runs.values(), at_least=30)
    celery.signal_worker("worker-a", signal.SIGKILL)
    final = finish(celery, runs.values(), timeout=420)
    report(celery, runs)

    assert {v: r["state"] for v, r in final.items()} == dict.fromkeys(runs, "success")
    for run in runs.values():
        assert tries(celery, run) >= 2, f"{run.variant}: the lost try was never run again"
    assert_double_charged(celery, runs["unprotected"])
    for variant in PROTECTED:
        assert_exactly_once(celery, runs[variant])
    # the resumable plain task is right here: the lost try died with its worker, no overlap
    assert tally(celery, runs["untagged"].business_date).missing == 0
    workers = grant_workers(celery, runs["protected"])
    a, b = (celery.celery.node_name(w) for w in ("worker-a", "worker-b"))
    assert workers[1] == a, describe_audit(audit(celery, runs["protected"]))
    assert b in workers.values(), describe_audit(audit(celery, runs["protected"]))


def broker_restarted_mid_run(celery: CeleryHarness) -> list[BillingRun]:
    """Restarts the broker while four tries run on worker-a and four more runs were sent after
    them (those worker-a's free slots did not take at once wait in its queue); returns the
    eight runs once they all ended, each run's tally printed."""
    celery.stack.stop_component("worker-b", timeout=20.0)
    try:
        running = start_all(celery, 0.1)
        for run in running.values():
            celery.wait_for_task_processes(run.dag_id, run.run_id, TASK)
        queued = start_all(celery, 0.02)
        for run in queued.values():  # its first task sent to the broker (prepare)
            # worker-a's two free slots may take some of them at once: those run, the rest
            # wait in the broker (a poll cannot always catch a message that short in it)
            wait_for(
                lambda run=run: dispatched(celery, run),
                timeout=120,
                what=f"a task of {run.variant} to be sent to the broker",
            )
        wait_charging(celery, running.values(), at_least=20)
        celery.broker.restart()
    finally:
        celery.restart_worker("worker-b")
    runs = [*running.values(), *queued.values()]
    final = finish(celery, runs, timeout=420)
    for run in runs:
        got = tally(celery, run.business_date)
        print(f"{run.variant}: {tries(celery, run)} tries; {got.summary()}")
    assert all(r["state"] == "success" for r in final.values()), final
    return runs
