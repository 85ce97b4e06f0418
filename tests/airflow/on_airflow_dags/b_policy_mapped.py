"""A DAG protected only by the policy (tag), with a mapped task named per tenant."""

from __future__ import annotations

import pendulum
import psycopg
from airflow.sdk import DAG, get_current_context, task

from airflow_plugins.protection.config import sink_dsn

with DAG(
    "b_policy_mapped",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    tags=["exactly-once", "scenario"],
):

    @task(map_index_template="{{ tenant }}", retries=0)
    def notify(tenant: str) -> str:
        context = get_current_context()
        day = context["dag_run"].conf["business_date"]
        with psycopg.connect(sink_dsn("billing_db"), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO b_deferral_runs (key, token, try_number) VALUES (%s, 0, %s)",
                (f"{day}/{tenant}", context["ti"].try_number),
            )
        return f"notified {tenant}"

    notify.expand(tenant=["acme", "globex", "initech"])
