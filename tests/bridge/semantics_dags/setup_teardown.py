"""Setup and teardown tasks as Airflow runs them: a work task that fails between a setup and its
teardown, a setup that fails and one that skips (their work and teardown, and a work task with an
``all_done`` rule that the setup reaches only indirectly), a teardown that fails with and without
``on_failure_fail_dagrun``, and setups/teardowns nested in task groups inside an outer scope.
One DAG per case, so the run's own state (teardowns left out of it) is compared too. Run in
Airflow and through the bridge by ``tests/bridge/test_corpus_truth.py``."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, setup, task, task_group, teardown
from airflow.sdk.exceptions import AirflowSkipException

_ARGS = {
    "schedule": None,
    "start_date": pendulum.datetime(2024, 1, 1, tz="UTC"),
    "default_args": {"retries": 0},
}


@setup
def create(name: str) -> str:
    return f"cluster-{name}"


@setup
def create_fails() -> str:
    raise RuntimeError("the setup fails on purpose")


@setup
def create_skips() -> str:
    raise AirflowSkipException("the setup skips on purpose")


@task
def work(cluster: str) -> str:
    return f"worked on {cluster}"


@task
def work_fails(cluster: str) -> str:
    raise RuntimeError(f"the work on {cluster} fails on purpose")


@task(trigger_rule="all_done")
def check(result: str | None) -> str:
    # all_done alone would run it; the setup it is in the scope of decides first
    return f"checked {result}"


def _delete(cluster: str | None) -> str:
    return f"deleted {cluster}"


def _delete_fails(cluster: str) -> str:
    raise RuntimeError(f"deleting {cluster} fails on purpose")


def deleting(task_id: str = "delete", *, fails: bool = False, fail_run: bool = False) -> Any:
    """A teardown task (a new decorator each time: Airflow's ``@teardown`` is called once)."""
    fn = _delete_fails if fails else _delete
    return teardown(fn, on_failure_fail_dagrun=fail_run).override(task_id=task_id)


with DAG("setup_teardown_work_fails", **_ARGS):
    # the work fails, its teardown still runs; the run fails (the work is its leaf)
    cluster = create("a")
    work_fails(cluster) >> deleting()(cluster)

with DAG("setup_teardown_setup_fails", **_ARGS):
    # a failed setup upstream-fails its work, the work's all_done check and its teardown; a
    # skipped one skips them
    cluster = create_fails()
    check(work(cluster)) >> deleting()(cluster)
    skipped = create_skips()
    check.override(task_id="check_skipped")(work.override(task_id="work_skipped")(skipped)) >> (
        deleting("delete_skipped")(skipped)
    )

with DAG("setup_teardown_teardown_fails", **_ARGS):
    # a failed teardown does not fail the run
    cluster = create("b")
    work(cluster) >> deleting(fails=True)(cluster)

with DAG("setup_teardown_teardown_fails_dagrun", **_ARGS):
    # ... unless on_failure_fail_dagrun
    cluster = create("c")
    work(cluster) >> deleting(fails=True, fail_run=True)(cluster)

with DAG("setup_teardown_in_groups", **_ARGS):

    @task_group
    def work_fails_inside() -> None:
        inner = create("inner-a")
        work_fails(inner) >> deleting()(inner)

    @task_group
    def setup_fails_inside() -> None:
        inner = create_fails()
        check(work(inner)) >> deleting()(inner)

    @task_group
    def outer_group() -> None:
        # a group in a group: its work is in the scope of the outer setup, indirectly
        @task_group
        def nested() -> None:
            inner = create("nested")
            work(inner) >> deleting()(inner)

        nested()

    outer = create("outer")
    groups = [work_fails_inside(), setup_fails_inside(), outer_group()]
    end = deleting("delete_outer")(outer)
    for group in groups:
        outer >> group >> end
    groups[0] >> work.override(task_id="after_groups")(outer)
