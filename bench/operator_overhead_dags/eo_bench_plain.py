"""Bench DAG: the same no-op tasks with the plugin's ``enabled`` switch off.

The switch is read from the environment each time the plugin asks, so setting it while this
file is imported turns the plugin off for everything in this DAG's task processes: the
operator runs its body plainly (no lease, no fence) and the task-side listener hooks return at
once. (Parsing happens in a child process of the dag-processor, so nothing else is affected;
the scheduler's DAG-run hooks stay on for both DAGs alike.)
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG
from overhead_noop import noop_dag_tasks

os.environ["AIRFLOW__EXACTLY_ONCE__ENABLED"] = "False"

with DAG(
    "eo_bench_plain",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    max_active_tasks=64,
    tags=["bench"],
):
    noop_dag_tasks(int(os.environ.get("EO_BENCH_BATCH", "50")))
