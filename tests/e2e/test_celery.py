"""The guarantee on CeleryExecutor: real ``airflow celery worker`` processes, a real Redis broker.

One stack for the module (``tests.harness.celery_harness``): two schedulers, workers
``worker-a`` and ``worker-b`` (4 slots each), Redis as broker with a 30 s visibility timeout,
the metadata database as Celery's result backend. Each scenario runs the four billing variants
of ``tests.e2e.billing_runs`` at once (protected, its unprotected twin, policy-tagged and plain)
and counts the rows in the billing database: 340 customers, each charged exactly once.

Where a scenario needs its tries on one worker, the other worker is stopped while they start
(prefetch 1 and 4 slots: the four tries fill worker-a), then started again to take over.

Where Airflow itself prevents the duplicate, the unprotected twin is asserted right too and the
scenario says which of Airflow's checks did it: a message re-delivered while its try runs (it
outlived the visibility timeout) is turned away by the API server's 409 on starting a task
instance that is no longer queued (Celery provider: "Task already running elsewhere").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.billing_runs import (
    PROTECTED,
    TASK,
    BillingRun,
    assert_exactly_once,
    audit,
    describe_audit,
    finish,
    start_all,
    tally,
    tries,
)
from tests.harness.celery_harness import CeleryHarness, celery_airflow

__all__ = ["celery_airflow"]

pytestmark = [pytest.mark.celery]


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
