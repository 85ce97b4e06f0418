"""A durable operator (``ResumableJobMixin``) handed over to the bridge: one job per date.

Runs ``bridge.run_task`` in temporalio's ``ActivityEnvironment`` (no server: Temporal's retry
of the activity is the boundary, not what is tested) on the real lease store, with the operator
rebuilt from a DAG folder as the worker rebuilds it. The first attempt submits the job and
loses its worker mid-poll; the next attempt reads the job id from the lease's task state and
re-attaches instead of submitting a second job.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from airflow_plugins.lease import LeaseStore
from bridge.cutover import ModeStore
from bridge.spec import RunMode, TaskInput, TaskKind, TaskSpec
from bridge.worker.activities import BridgeActivities
from bridge.worker.catalog import TaskCatalog
from tests.airflow.durable_jobs import JobClient, JobSystem

DAG_FILE = """
import pendulum
from airflow.sdk import DAG

from tests.airflow.durable_jobs import SparkSubmitOperator

with DAG("spark_bridge", schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1)):
    SparkSubmitOperator(task_id="aggregate")
"""


def test_a_retried_activity_reattaches_to_the_job_its_first_attempt_submitted(
    lease_db: str, sink_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = JobSystem(sink_db)
    jobs.create()
    monkeypatch.setattr(JobClient, "jobs_dsn", sink_db)
    monkeypatch.setattr(JobClient, "after_submit", [])
    monkeypatch.setattr(JobClient, "poll_failures", ["the worker lost the cluster"])
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "spark_bridge.py").write_text(textwrap.dedent(DAG_FILE))
    catalog = TaskCatalog(str(folder))
    catalog.load()  # on the main thread: Airflow's parser uses SIGALRM
    spec = TaskSpec(task_id="aggregate", kind=TaskKind.EXECUTE, lease_ttl_s=5)
    inp = TaskInput(
        dag_id="spark_bridge", business_date="2024-02-15", task=spec, mode=RunMode.PRIMARY
    )
    env = ActivityEnvironment()
    with LeaseStore(lease_db, horizon_days=4000) as store:
        activities = BridgeActivities(store, catalog, ModeStore(store))
        with pytest.raises(ApplicationError, match="lost the cluster"):
            env.run(activities.run_task, inp)
        assert [job for job, _ in jobs.jobs()] == ["job-1"]
        jobs.finish()
        result = env.run(activities.run_task, inp)  # Temporal's retry of the activity
    assert result.status == "succeeded"
    assert [job for job, _ in jobs.jobs()] == ["job-1"]
