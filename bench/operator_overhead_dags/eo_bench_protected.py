"""Bench DAG: ``EO_BENCH_BATCH`` protected no-op tasks per run (plugin enabled)."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG
from overhead_noop import noop_dag_tasks

with DAG(
    "eo_bench_protected",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    max_active_tasks=64,
    tags=["bench"],
):
    noop_dag_tasks(int(os.environ.get("EO_BENCH_BATCH", "50")))
