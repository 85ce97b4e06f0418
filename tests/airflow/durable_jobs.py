"""Durable operators (Airflow 3.3's ``ResumableJobMixin``) against a stand-in job system.

The boundary stand-ins, shared by the tests and their child process:

* ``JobSystem``: an external job system (Spark, Databricks...) as a table of the test's
  database: one row per accepted submit; a submit carrying an idempotency key it has seen
  returns that job, as Databricks' ``idempotency_token`` or Dataproc's ``request_id`` do.
* ``AirflowStateStore``: Airflow's own task state store as its API server keeps it, per task
  instance scope (dag, run, task, map index), in a table; the real ``TaskStateStoreAccessor``
  talks to it through a stand-in of the supervisor's comms (a task here has no supervisor).

The operators are real ``ResumableJobMixin`` operators, executed as tests/airflow/conftest.py
executes operators.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import pendulum
import psycopg
from airflow.sdk import DAG, BaseOperator
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection import policy
from airflow_plugins.protection.operators import ExactlyOnceOperator
from airflow_plugins.protection.task_state_store import idempotency_key_of

DAG_ID = "spark_nightly"
TASK_ID = "aggregate"
KEY = f"{DAG_ID}/{TASK_ID}/2024-02-15"

JOBS_DDL = """
CREATE TABLE IF NOT EXISTS jobs (
    id              bigserial   PRIMARY KEY,
    idempotency_key text        UNIQUE,
    submitted_by    text        NOT NULL,
    status          text        NOT NULL DEFAULT 'RUNNING'
);
CREATE TABLE IF NOT EXISTS airflow_task_state (
    dag_id text, run_id text, task_id text, map_index integer, key text, value jsonb,
    PRIMARY KEY (dag_id, run_id, task_id, map_index, key)
)
"""


class JobSystem:
    """The stand-in job system (see the module)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def create(self) -> None:
        """Creates its tables (and the Airflow store's)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(JOBS_DDL)

    def submit(self, idempotency_key: str | None, by: str) -> str:
        """Accepts a job; a known idempotency key gets its job back."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "INSERT INTO jobs (idempotency_key, submitted_by) VALUES (%s, %s) "
                "ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
                (idempotency_key, by),
            ).fetchone()
            if row is None:
                row = conn.execute(
                    "SELECT id FROM jobs WHERE idempotency_key = %s", (idempotency_key,)
                ).fetchone()
        assert row is not None
        return f"job-{row[0]}"

    def find(self, idempotency_key: str) -> str | None:
        """The job submitted with ``idempotency_key``, if any."""
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT id FROM jobs WHERE idempotency_key = %s", (idempotency_key,)
            ).fetchone()
        return None if row is None else f"job-{row[0]}"

    def status(self, job_id: str) -> str:
        """A job's status (RUNNING, SUCCEEDED, FAILED)."""
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT status FROM jobs WHERE id = %s", (int(job_id.removeprefix("job-")),)
            ).fetchone()
        return "UNKNOWN" if row is None else str(row[0])

    def finish(self, status: str = "SUCCEEDED") -> None:
        """Ends every running job."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("UPDATE jobs SET status = %s WHERE status = 'RUNNING'", (status,))

    def jobs(self) -> list[tuple[str, str]]:
        """Every job accepted: (job id, who submitted it)."""
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute("SELECT id, submitted_by FROM jobs ORDER BY id").fetchall()
        return [(f"job-{r[0]}", str(r[1])) for r in rows]


class AirflowStateStore:
    """Airflow's task state store per task instance, served to the real accessor."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._scopes: dict[uuid.UUID, tuple[str, str, str, int]] = {}

    def accessor(self, context: dict[str, Any]) -> Any:
        """The ``task_state_store`` the task runner puts in ``context`` (a try's own ti id)."""
        from airflow.sdk._shared.state import TaskScope
        from airflow.sdk.execution_time.context import TaskStateStoreAccessor

        ti = context["ti"]
        ti_id = uuid.uuid4()
        self._scopes[ti_id] = (ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
        scope = TaskScope(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
        return TaskStateStoreAccessor(ti_id=ti_id, scope=scope)

    def send(self, msg: Any) -> Any:
        """The supervisor's side of the four task state messages."""
        from airflow.sdk.exceptions import ErrorType
        from airflow.sdk.execution_time.comms import ErrorResponse, OKResponse, TaskStateStoreResult

        scope = self._scopes[msg.ti_id]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            if msg.type == "GetTaskStateStore":
                row = conn.execute(
                    "SELECT value FROM airflow_task_state WHERE (dag_id, run_id, task_id, "
                    "map_index, key) = (%s, %s, %s, %s, %s)",
                    (*scope, msg.key),
                ).fetchone()
                if row is None:
                    return ErrorResponse(error=ErrorType.TASK_STORE_NOT_FOUND)
                return TaskStateStoreResult(value=row[0])
            if msg.type == "SetTaskStateStore":
                conn.execute(
                    "INSERT INTO airflow_task_state VALUES (%s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (dag_id, run_id, task_id, map_index, key) "
                    "DO UPDATE SET value = excluded.value",
                    (*scope, msg.key, json.dumps(msg.value)),
                )
            elif msg.type == "DeleteTaskStateStore":
                conn.execute(
                    "DELETE FROM airflow_task_state WHERE (dag_id, run_id, task_id, "
                    "map_index, key) = (%s, %s, %s, %s, %s)",
                    (*scope, msg.key),
                )
            else:
                conn.execute(
                    "DELETE FROM airflow_task_state WHERE (dag_id, run_id, task_id, "
                    "map_index) = (%s, %s, %s, %s)",
                    scope,
                )
        return OKResponse(ok=True)

    def values(self) -> list[tuple[str, str, Any]]:
        """Every value Airflow's store holds: (run id, key, value)."""
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT run_id, key, value FROM airflow_task_state ORDER BY run_id, key"
            ).fetchall()
        return [(str(r[0]), str(r[1]), r[2]) for r in rows]


def serve_airflow_store(store: AirflowStateStore) -> None:
    """Makes ``store`` the supervisor the task state accessor talks to, in this process."""
    from airflow.sdk.execution_time import task_runner

    task_runner.SUPERVISOR_COMMS = store  # type: ignore[assignment]


class JobClient:
    """The operator side of the job system: what a durable operator implements."""

    external_id_key = "job_id"
    jobs_dsn: ClassVar[str] = ""
    # test hooks: called with the job id right after the job system accepted it (before the
    # operator returns it, so before anything records it)
    after_submit: ClassVar[list[Callable[[str], None]]] = []
    poll_failures: ClassVar[list[str]] = []  # a poll raises the next of these

    def _jobs(self) -> JobSystem:
        return JobSystem(self.jobs_dsn)

    def submit_job(self, context: Any) -> Any:
        ti = context["ti"]
        job_id = self._jobs().submit(
            # the same for every try and run of the business date, under the plugin
            idempotency_key_of(context, self.external_id_key),
            by=f"{ti.run_id}#{ti.try_number}",
        )
        for hook in list(self.after_submit):
            hook(job_id)
        return job_id

    def get_job_status(self, external_id: Any, context: Any) -> str:
        return self._jobs().status(str(external_id))

    def is_job_active(self, status: str) -> bool:
        return status == "RUNNING"

    def is_job_succeeded(self, status: str) -> bool:
        return status == "SUCCEEDED"

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        deadline = time.monotonic() + 60
        while (status := self._jobs().status(str(external_id))) == "RUNNING":
            if self.poll_failures:
                raise ConnectionError(self.poll_failures.pop(0))
            if time.monotonic() > deadline:
                raise TimeoutError(f"{external_id} still running")
            time.sleep(0.05)
        if status != "SUCCEEDED":
            raise RuntimeError(f"{external_id} ended {status}")

    def get_job_result(self, external_id: Any, context: Any) -> Any:
        return {"job_id": external_id}


class FindsJobs:
    """The lookup a durable operator offers the plugin: the job submitted with a key."""

    def find_job(self, idempotency_key: str, context: Any) -> Any:
        return JobSystem(JobClient.jobs_dsn).find(idempotency_key)


class SparkSubmitOperator(JobClient, FindsJobs, ResumableJobMixin, BaseOperator):
    """A plain Airflow durable operator; protected by the policy in a tagged DAG."""

    def execute(self, context: Any) -> Any:
        return self.execute_resumable(context)


class SparkSubmitWithoutLookup(JobClient, ResumableJobMixin, BaseOperator):
    """The same without ``find_job``."""

    def execute(self, context: Any) -> Any:
        return self.execute_resumable(context)


class ExactlyOnceSparkSubmit(JobClient, FindsJobs, ResumableJobMixin, ExactlyOnceOperator):
    """A durable operator that is an ``ExactlyOnceOperator`` itself."""

    def execute_protected(self, fence: Fence, context: Any) -> Any:
        return self.execute_resumable(context)


def durable_task(operator: type[BaseOperator], *, tagged: bool = True) -> Any:
    """``operator`` as the task of the nightly DAG, wrapped by the policy when it must be."""
    with DAG(
        DAG_ID,
        schedule="0 2 * * *",
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        tags=["exactly-once"] if tagged else [],
    ):
        task = operator(task_id=TASK_ID)
    policy.task_policy(task)
    return task
