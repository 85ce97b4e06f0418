"""A durable operator's try frozen (SIGSTOP) right after its submit, past its lease (real Airflow).

Try 1 of each twin (``tests/e2e/dags/durable_twins.py``) submits its job; while its submit is
still answering, its supervisor and task process are paused. Airflow's heartbeat timeout (20 s)
fails the try and try 2 starts; then the old processes are resumed.

Protected (tagged, the policy): try 2 takes the lease over, finds try 1's intent without a job
id, looks the job up by its idempotency key and re-attaches: one job for the date. Plain
(untagged): try 2 reads "no job id" from Airflow's own task state store and submits again:
two jobs.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from tests.harness.airflow_harness import AirflowHarness, signal_pids, wait_for

# the stand-in job system of tests/e2e/dags/durable_twins.py, made before the twins run (two
# first tries creating it at once would race)
JOBS_DDL = (
    "CREATE TABLE IF NOT EXISTS e2e_durable_jobs (id bigserial PRIMARY KEY, dag_id text NOT "
    "NULL, business_date text NOT NULL, idempotency_key text UNIQUE, submitted_by text NOT "
    "NULL, status text NOT NULL DEFAULT 'RUNNING')"
)
TASK = "aggregate"
DAGS = ("durable_protected", "durable_plain")


def _jobs(airflow: AirflowHarness, dag_id: str, business_date: str) -> list[dict[str, Any]]:
    with psycopg.connect(airflow.sink_dsn) as conn:
        if conn.execute("SELECT to_regclass('e2e_durable_jobs')").fetchone() == (None,):
            return []
        rows = conn.execute(
            "SELECT id, submitted_by, status FROM e2e_durable_jobs "
            "WHERE dag_id = %s AND business_date = %s ORDER BY id",
            (dag_id, business_date),
        ).fetchall()
    return [{"id": r[0], "submitted_by": r[1], "status": r[2]} for r in rows]


def _finish_jobs(airflow: AirflowHarness, business_date: str) -> None:
    with psycopg.connect(airflow.sink_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE e2e_durable_jobs SET status = 'SUCCEEDED' WHERE business_date = %s",
            (business_date,),
        )


def _reattached(airflow: AirflowHarness, key: str) -> bool:
    with airflow.lease_store() as store:
        return any(
            r["event"] == "job_submitted" and r["outcome"] == "found" for r in store.history(key)
        )


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_frozen_submitter_is_taken_over_and_reattached_not_resubmitted(
    airflow: AirflowHarness, business_date: str
) -> None:
    airflow.ensure_schedulers()
    with psycopg.connect(airflow.sink_dsn, autocommit=True) as conn:
        conn.execute(JOBS_DDL)
    conf = {"business_date": business_date, "submit_pause": 120}
    runs = {dag: airflow.trigger_dag_run(dag, conf) for dag in DAGS}
    old = {
        dag: airflow.wait_for_task_processes(dag, run, TASK, timeout=180)
        for dag, run in runs.items()
    }
    for dag in DAGS:
        wait_for(
            lambda dag=dag: _jobs(airflow, dag, business_date),
            timeout=120,
            what=f"{dag}'s first submit",
        )
    assert {dag: p.try_number for dag, p in old.items()} == dict.fromkeys(DAGS, 1)
    paused = [pid for p in old.values() for pid in (p.supervisor, p.task)]
    signal_pids(paused, signal.SIGSTOP)
    try:
        for dag, run in runs.items():
            airflow.wait_for_task_processes(dag, run, TASK, min_try=2, timeout=180)
        wait_for(
            lambda: len(_jobs(airflow, "durable_plain", business_date)) == 2,
            timeout=120,
            what="the plain twin's try 2 to submit again",
        )
        key = f"durable_protected/{TASK}/{business_date}"
        wait_for(lambda: _reattached(airflow, key), timeout=120, what="try 2 to find try 1's job")
        _finish_jobs(airflow, business_date)
    finally:
        signal_pids(paused, signal.SIGCONT)
    final = {dag: airflow.wait_for_run_state(dag, run, timeout=240) for dag, run in runs.items()}
    protected = _jobs(airflow, "durable_protected", business_date)
    plain = _jobs(airflow, "durable_plain", business_date)
    print(f"jobs submitted: protected {len(protected)}, plain {len(plain)}")
    assert {dag: r["state"] for dag, r in final.items()} == dict.fromkeys(DAGS, "success")
    assert [j["submitted_by"].rsplit("/", 1)[-1] for j in protected] == ["try1"]
    assert [j["submitted_by"].rsplit("/", 1)[-1] for j in plain] == ["try1", "try2"]
