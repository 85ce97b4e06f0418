"""DAGs the policy tests parse: one opted in by tag, one not (a real DAG folder for DagBag)."""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, task

from airflow_plugins.protection.operators import ExactlyOnceOperator

START = pendulum.datetime(2024, 1, 1, tz="UTC")


def count_run(name: str) -> str:
    """The work: appends one line to the counter file; returns a small value."""
    with Path(os.environ["EO_POLICY_COUNTER"]).open("a") as out:
        out.write(f"{name}\n")
    return f"{name} done"


with DAG("policy_tagged", schedule="0 2 * * *", start_date=START, tags=["exactly-once"]):
    PythonOperator(task_id="py", python_callable=count_run, op_args=["py"])
    PythonOperator(task_id="py_once", python_callable=count_run, op_args=["once"], retries=0)

    @task
    def deco() -> str:
        return count_run("deco")

    @task
    def fan(item: str) -> str:
        return item

    @task(map_index_template="{{ tenant }}")
    def per_tenant(tenant: str) -> str:
        return count_run(f"tenant {tenant}")

    deco()
    fan.expand(item=["a", "b"])
    per_tenant.expand(tenant=["acme", "globex"])
    BashOperator(task_id="bash", bash_command='echo bash >> "$EO_POLICY_COUNTER"; echo bash done')
    ExactlyOnceOperator(task_id="already", python_callable=lambda fence: 1)


with DAG("policy_untagged", schedule="0 2 * * *", start_date=START, tags=["billing"]):
    PythonOperator(task_id="py", python_callable=count_run, op_args=["untagged"])
