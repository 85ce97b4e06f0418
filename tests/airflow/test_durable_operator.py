"""Airflow 3.3's durable operators (``ResumableJobMixin``) under the lease: one job per date.

Real ``ResumableJobMixin`` operators, executed as the other operator tests execute them (see
conftest), against a stand-in job system and Airflow's per-task-instance state store at the
boundary (``durable_jobs``). What a user would see is asserted: the jobs the job system
accepted, the job id every try and run reads, the task's result. Each scenario runs with the
plugin and, where the plugin is what makes the difference, without it: plain Airflow submits
twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_plugins.lease import LeaseStore
from airflow_plugins.protection import policy
from airflow_plugins.protection.task_state_store import LeaseTaskStateStore
from tests.airflow.conftest import task_context
from tests.airflow.durable_jobs import (
    KEY,
    AirflowStateStore,
    ExactlyOnceSparkSubmit,
    JobClient,
    JobSystem,
    SparkSubmitOperator,
    SparkSubmitWithoutLookup,
    durable_task,
)
from tests.lease.waiting import wait_for

NIGHT = datetime(2024, 2, 15, 2, tzinfo=UTC)
WORKER = Path(__file__).parent / "durable_worker.py"


@pytest.fixture
def jobs(plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> JobSystem:
    """The stand-in job system (and Airflow's state store) in the sink database."""
    from airflow.sdk.execution_time import task_runner

    system = JobSystem(plugin_env["sink"])
    system.create()
    monkeypatch.setattr(JobClient, "jobs_dsn", plugin_env["sink"])
    monkeypatch.setattr(JobClient, "after_submit", [])
    monkeypatch.setattr(JobClient, "poll_failures", [])
    monkeypatch.setattr(
        task_runner, "SUPERVISOR_COMMS", AirflowStateStore(plugin_env["sink"]), raising=False
    )
    return system


def _airflow_store() -> AirflowStateStore:
    from airflow.sdk.execution_time import task_runner

    store: AirflowStateStore = task_runner.SUPERVISOR_COMMS  # type: ignore[assignment]
    return store


def _context(task: Any, **kwargs: Any) -> dict[str, Any]:
    """A try's context, with the task state store Airflow's task runner puts there."""
    context = task_context(task, **kwargs)
    context["ti"].stats_tags = {}  # a RuntimeTaskInstance's, read by ResumableJobMixin
    context["task_state_store"] = _airflow_store().accessor(context)
    return context


def _plugin_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__ENABLED", "False")


def _gate_submits() -> threading.Event:
    """Holds every submit after the job system accepted it (a slow submit RPC) until set."""
    gate = threading.Event()
    JobClient.after_submit.append(lambda job_id: gate.wait(30))
    return gate


def _in_thread(run: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(run())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def _job_state(lease_dsn: str) -> list[tuple[str, Any, int]]:
    """The lease store's task state of the key: (name, value, writer's token)."""
    with psycopg.connect(lease_dsn) as conn:
        rows = conn.execute(
            "SELECT name, value, token FROM runlease.task_state WHERE key = %s ORDER BY name",
            (KEY,),
        ).fetchall()
    return [(str(r[0]), r[1], int(r[2])) for r in rows]


# -- two tries at once --------------------------------------------------------------------------


def test_two_concurrent_tries_submit_one_job(jobs: JobSystem) -> None:
    task = durable_task(SparkSubmitOperator)
    assert policy.is_wrapped(task)
    gate = _gate_submits()
    first_context = _context(task, logical_date=NIGHT, try_number=1)
    first, first_out = _in_thread(lambda: task.execute(first_context))
    wait_for(lambda: len(jobs.jobs()) == 1 or first_out, timeout=30)  # inside its submit
    assert not first_out, first_out
    # the orphaned task's new try starts while the first still runs
    second_context = _context(task, logical_date=NIGHT, try_number=2)
    with pytest.raises(TaskDeferred):
        task.execute(second_context)
    gate.set()
    jobs.finish()
    first.join(30)
    assert first_out == [{"job_id": "job-1"}]
    resumed = getattr(task, policy.RESUME_METHOD)(second_context, {"status": "released"})
    assert resumed == {"job_id": "job-1"}
    assert [job for job, _ in jobs.jobs()] == ["job-1"]
    # the job id lives in the lease store, under the business key; Airflow's store got nothing
    assert [(n, v) for n, v, _ in _job_state(os.environ["AIRFLOW__EXACTLY_ONCE__LEASE_DSN"])] == [
        ("job_id", "job-1")
    ]
    assert _airflow_store().values() == []
    # the context's own store is back once the body ended
    assert not isinstance(first_context["task_state_store"], LeaseTaskStateStore)


def test_without_the_plugin_two_concurrent_tries_submit_two_jobs(
    jobs: JobSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin_off(monkeypatch)
    task = durable_task(SparkSubmitOperator)
    gate = _gate_submits()
    first, first_out = _in_thread(
        lambda: task.execute(_context(task, logical_date=NIGHT, try_number=1))
    )
    wait_for(lambda: len(jobs.jobs()) == 1, timeout=30)
    second, second_out = _in_thread(
        lambda: task.execute(_context(task, logical_date=NIGHT, try_number=2))
    )
    wait_for(lambda: len(jobs.jobs()) == 2, timeout=30)  # it read "no job id" too
    gate.set()
    jobs.finish()
    first.join(30)
    second.join(30)
    assert sorted(first_out + second_out, key=str) == [{"job_id": "job-1"}, {"job_id": "job-2"}]
    assert [by for _, by in jobs.jobs()] == [
        "scheduled__2024-02-15T02:00:00+00:00#1",
        "scheduled__2024-02-15T02:00:00+00:00#2",
    ]


# -- a second DAG run of the date -----------------------------------------------------------------


def _first_run_loses_its_worker(task: Any, jobs: JobSystem) -> None:
    JobClient.poll_failures.append("worker lost its connection to the cluster")
    with pytest.raises(ConnectionError):
        task.execute(_context(task, logical_date=NIGHT))
    assert [job for job, _ in jobs.jobs()] == ["job-1"]  # still running


def test_a_second_dag_run_of_the_date_reattaches_to_the_first_runs_job(
    jobs: JobSystem, plugin_env: dict[str, str]
) -> None:
    task = durable_task(SparkSubmitOperator)
    _first_run_loses_its_worker(task, jobs)
    jobs.finish()
    # the date is triggered again by hand: another run id, the same business key
    manual = _context(task, run_id="manual__rerun", conf={"business_date": "2024-02-15"})
    task.execute(manual)  # ResumableJobMixin returns its poll's None when it re-attaches
    assert [job for job, _ in jobs.jobs()] == ["job-1"]
    with LeaseStore(plugin_env["lease"]) as store:
        row = store.get(KEY)
    assert row is not None
    assert row["state"] == "succeeded"
    # and a later run is handed the recorded result, submitting nothing
    later = _context(task, run_id="manual__again", conf={"business_date": "2024-02-15"})
    task.execute(later)
    assert len(jobs.jobs()) == 1


def test_without_the_plugin_a_second_dag_run_submits_a_second_job(
    jobs: JobSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin_off(monkeypatch)
    task = durable_task(SparkSubmitOperator)
    _first_run_loses_its_worker(task, jobs)
    manual = _context(task, run_id="manual__rerun", conf={"business_date": "2024-02-15"})
    jobs_before = len(jobs.jobs())
    thread, out = _in_thread(lambda: task.execute(manual))
    wait_for(lambda: len(jobs.jobs()) == jobs_before + 1, timeout=30)
    jobs.finish()
    thread.join(30)
    assert out == [{"job_id": "job-2"}]
    # Airflow's store is per task instance: the second run never saw the first run's job
    assert [(run, value) for run, _, value in _airflow_store().values()] == [
        ("manual__rerun", "job-2"),
        ("scheduled__2024-02-15T02:00:00+00:00", "job-1"),
    ]


# -- a try frozen between submit and record -------------------------------------------------------


def _frozen_first_try(plugin_env: dict[str, str], enabled: bool) -> subprocess.Popen[str]:
    """Try 1 in a child process, stopped (SIGSTOP) right after the job system accepted."""
    env = {
        **os.environ,
        "EO_LEASE_DSN": plugin_env["lease"],
        "EO_JOBS_DSN": plugin_env["sink"],
        "EO_ENABLED": str(enabled),
    }
    child = subprocess.Popen(
        [sys.executable, str(WORKER)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _, status = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), child.communicate()
    return child


def _resume(child: subprocess.Popen[str]) -> dict[str, Any]:
    os.kill(child.pid, signal.SIGCONT)
    out, err = child.communicate(timeout=60)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, err
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def _take_over(task: Any, context: dict[str, Any]) -> Any:
    """Runs the next try until the frozen try's lease expired and it is taken over."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return task.execute(context)
        except TaskDeferred:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_a_try_frozen_between_submit_and_record_is_taken_over_and_reattached_via_find_job(
    jobs: JobSystem, plugin_env: dict[str, str]
) -> None:
    frozen = _frozen_first_try(plugin_env, enabled=True)
    try:
        assert [job for job, _ in jobs.jobs()] == ["job-1"]
        jobs.finish()
        task = durable_task(ExactlyOnceSparkSubmit)
        result = _take_over(task, _context(task, logical_date=NIGHT, try_number=2))
    finally:
        answer = _resume(frozen)
    assert result == {"job_id": "job-1"}  # found by its idempotency key, not submitted again
    assert [job for job, _ in jobs.jobs()] == ["job-1"]
    # the frozen try woke up and tried to record its job id: refused, it no longer holds the key
    assert answer["error"] in ("LeaseLost", "FenceStopped", "AirflowException"), answer
    with LeaseStore(plugin_env["lease"]) as store:
        row = store.get(KEY)
        events = [(r["event"], r["outcome"], r["token"]) for r in store.history(KEY)]
    assert row is not None
    assert (row["state"], row["result"]) == ("succeeded", {"job_id": "job-1"})
    assert _job_state(plugin_env["lease"]) == [("job_id", "job-1", row["token"])]
    assert ("job_intent", "in_doubt", row["token"]) in events
    assert ("job_submitted", "found", row["token"]) in events
    assert not [e for e in events if e[0] == "job_submitted" and e[2] != row["token"]]


def test_without_the_plugin_a_try_frozen_after_submit_means_two_jobs(
    jobs: JobSystem, plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen = _frozen_first_try(plugin_env, enabled=False)
    _plugin_off(monkeypatch)
    try:
        task = durable_task(ExactlyOnceSparkSubmit)
        context = _context(task, logical_date=NIGHT, try_number=2)
        thread, out = _in_thread(lambda: task.execute(context))
        wait_for(lambda: len(jobs.jobs()) == 2, timeout=30)
        jobs.finish()
        thread.join(30)
    finally:
        answer = _resume(frozen)
    assert out == [{"job_id": "job-2"}]
    assert answer == {"result": {"job_id": "job-1"}}
    assert len(jobs.jobs()) == 2
    # and the frozen try's late write replaced the job id the retry had stored
    assert [(key, value) for _, key, value in _airflow_store().values()] == [("job_id", "job-1")]


def test_without_find_job_a_takeover_in_doubt_fails_and_submits_nothing(
    jobs: JobSystem,
) -> None:
    task = durable_task(SparkSubmitWithoutLookup)

    class WorkerDied(Exception):
        pass

    def die(job_id: str) -> None:
        raise WorkerDied(f"the worker died after {job_id} was accepted")

    JobClient.after_submit.append(die)
    with pytest.raises(WorkerDied):
        task.execute(_context(task, logical_date=NIGHT, try_number=1))
    JobClient.after_submit.clear()
    with pytest.raises(AirflowFailException, match=r"idempotency key [0-9a-f]{64}"):
        task.execute(_context(task, logical_date=NIGHT, try_number=2))
    assert [job for job, _ in jobs.jobs()] == ["job-1"]


def test_the_lease_store_has_airflows_task_state_store_interface() -> None:
    """Every public method of Airflow's accessor, with the same parameters."""
    import inspect

    from airflow.sdk.execution_time.context import TaskStateStoreAccessor

    def public(cls: type) -> dict[str, list[tuple[str, Any, Any]]]:
        return {
            name: [
                (p.name, p.kind, p.default)
                for p in inspect.signature(getattr(cls, name)).parameters.values()
            ]
            for name in dir(cls)
            if not name.startswith("_") and callable(getattr(cls, name))
        }

    airflows = public(TaskStateStoreAccessor)
    ours = public(LeaseTaskStateStore)
    assert set(airflows) == {"get", "set", "delete", "clear"}
    assert {name: ours[name] for name in airflows} == airflows
