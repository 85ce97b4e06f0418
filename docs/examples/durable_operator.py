"""A durable operator under the lease: Airflow 3.3's ``ResumableJobMixin`` and a job service.

The operator submits one long job to a job service over HTTP (as Databricks, Dataproc or EMR
on EKS are driven) and polls it. In a DAG tagged ``exactly-once`` the cluster policy protects
it, and the job is submitted once per business date: a second try or a second DAG run of the
date re-attaches to the job instead of submitting another (docs/airflow_plugin.md, "Durable
operators"). ``tests/airflow/test_durable_example.py`` runs this file against a stand-in job
service and checks that the guide's lines are in it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pendulum
from airflow.sdk import DAG, BaseOperator
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from airflow.sdk.exceptions import AirflowException

from airflow_plugins.protection.task_state_store import idempotency_key_of


class JobServiceOperator(ResumableJobMixin, BaseOperator):
    """Submits ``payload`` as one job to the job service at ``base_url`` and waits for it."""

    external_id_key = "job_id"
    template_fields = ("payload",)

    def __init__(
        self, *, base_url: str, payload: dict[str, Any], poll_interval: float = 5.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url.rstrip("/")
        self.payload = payload
        self.poll_interval = poll_interval

    def execute(self, context: Any) -> Any:
        return self.execute_resumable(context)

    def submit_job(self, context: Any) -> Any:
        # the same for every try and DAG run of the business date (None without the plugin)
        key = idempotency_key_of(context, self.external_id_key)
        headers = {"Idempotency-Key": key} if key else {}
        return self._call("POST", "/jobs", body=self.payload, headers=headers)["id"]

    def find_job(self, idempotency_key: str, context: Any) -> Any:
        # asked by a try that took over from one that died between submit and record
        query = urllib.parse.urlencode({"idempotency_key": idempotency_key})
        found = self._call("GET", f"/jobs?{query}")
        return found[0]["id"] if found else None

    def get_job_status(self, external_id: Any, context: Any) -> str:
        return str(self._call("GET", f"/jobs/{external_id}")["status"])

    def is_job_active(self, status: str) -> bool:
        return status in ("PENDING", "RUNNING")

    def is_job_succeeded(self, status: str) -> bool:
        return status == "SUCCEEDED"

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        while self.is_job_active(status := self.get_job_status(external_id, context)):
            time.sleep(self.poll_interval)
        if not self.is_job_succeeded(status):
            raise AirflowException(f"job {external_id} ended {status}")

    def get_job_result(self, external_id: Any, context: Any) -> Any:
        return {"job_id": external_id}

    def _call(
        self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        request = urllib.request.Request(
            self.base_url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise AirflowException(f"job service answered {exc.code} to {method} {path}") from exc


with DAG(
    "warehouse_nightly",
    schedule="0 3 * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["exactly-once"],  # the policy protects its tasks, durable operators included
) as dag:
    JobServiceOperator(
        task_id="rebuild_facts",
        base_url="http://jobs.internal:8080",
        payload={"job": "rebuild_facts", "date": "{{ ds }}"},
    )
