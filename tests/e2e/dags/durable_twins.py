"""Scenario twins of a durable operator (Airflow 3.3's ``ResumableJobMixin``) for the e2e tests.

``JobTableOperator`` submits one job per run to a stand-in job system (the table
``e2e_durable_jobs`` in the billing database: one row per accepted submit, a known idempotency
key gets its job back) and polls it until the test ends it. Try 1's submit takes
``submit_pause`` seconds to answer after the job was accepted: the window in which the test
freezes it.

* ``durable_protected``: tagged ``exactly-once``: the policy protects it (fenced task state,
  fenced submit, ``find_job``).
* ``durable_plain``: the same operator untagged: plain Airflow with its own task state store.

Both take the business date from the run's conf ``business_date``.
"""

from __future__ import annotations

import time
from typing import Any

import pendulum
import psycopg
from airflow.sdk import DAG, BaseOperator, Param
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from billing_charges import SINK_CONN_ID

from airflow_plugins.protection.config import sink_dsn
from airflow_plugins.protection.task_state_store import idempotency_key_of


class JobTableOperator(ResumableJobMixin, BaseOperator):
    """A durable operator of the stand-in job system (see the module)."""

    external_id_key = "job_id"

    def _conn(self) -> psycopg.Connection[Any]:
        return psycopg.connect(sink_dsn(SINK_CONN_ID), autocommit=True)

    def execute(self, context: Any) -> Any:
        return self.execute_resumable(context)

    def submit_job(self, context: Any) -> Any:
        ti = context["ti"]
        date = str(context["dag_run"].conf["business_date"])
        key = idempotency_key_of(context, self.external_id_key)
        with self._conn() as conn:
            row = conn.execute(
                "INSERT INTO e2e_durable_jobs (dag_id, business_date, idempotency_key, "
                "submitted_by) VALUES (%s, %s, %s, %s) ON CONFLICT (idempotency_key) "
                "DO UPDATE SET idempotency_key = excluded.idempotency_key RETURNING id",
                (ti.dag_id, date, key, f"{ti.run_id}/try{ti.try_number}"),
            ).fetchone()
        assert row is not None
        if ti.try_number == 1:
            time.sleep(float(context["params"]["submit_pause"]))
        return f"job-{row[0]}"

    def find_job(self, idempotency_key: str, context: Any) -> Any:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT id FROM e2e_durable_jobs WHERE idempotency_key = %s", (idempotency_key,)
            ).fetchone()
        return None if row is None else f"job-{row[0]}"

    def get_job_status(self, external_id: Any, context: Any) -> str:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT status FROM e2e_durable_jobs WHERE id = %s",
                (int(str(external_id).removeprefix("job-")),),
            ).fetchone()
        return "UNKNOWN" if row is None else str(row[0])

    def is_job_active(self, status: str) -> bool:
        return status == "RUNNING"

    def is_job_succeeded(self, status: str) -> bool:
        return status == "SUCCEEDED"

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        while self.is_job_active(status := self.get_job_status(external_id, context)):
            time.sleep(0.5)
        if not self.is_job_succeeded(status):
            raise RuntimeError(f"{external_id} ended {status}")

    def get_job_result(self, external_id: Any, context: Any) -> Any:
        return {"job_id": external_id}


for dag_id, tags in (
    ("durable_protected", ["exactly-once", "scenario"]),
    ("durable_plain", ["scenario"]),
):
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        max_active_runs=4,
        params={"submit_pause": Param(0.0, type="number", minimum=0)},
        tags=tags,
    ):
        JobTableOperator(task_id="aggregate", retries=4, retry_delay=pendulum.duration(seconds=5))
