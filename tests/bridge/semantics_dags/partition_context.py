"""The run's asset partition, read every way a task reads it: ``dag_run.partition_key`` /
``partition_date``, the ``partition_key`` / ``partition_date`` context arguments, the current
context, and a template (this project's DAG; the corpus comparison triggers it with a partition
key in Airflow and hands the same key to the bridge, and compares the XComs).

Scheduled on a daily-partitioned asset nothing produces, so it runs only when triggered (Airflow
accepts a ``partition_key`` in the trigger of a partitioned DAG), and its key is a day
(``StartOfDayMapper``), which Airflow resolves to a ``partition_date``. ``partition_regions``
is partitioned by region (``us``, ``eu``, ``apac``: keys with no date), as
``ingest_region_stats`` is.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import (
    DAG,
    Asset,
    PartitionedAssetTimetable,
    PartitionedAtRuntime,
    StartOfDayMapper,
    get_current_context,
    task,
)

with DAG(
    "partition_context",
    schedule=PartitionedAssetTimetable(
        assets=Asset(uri="file://bridge-semantics/never-produced.csv", name="never_produced"),
        default_partition_mapper=StartOfDayMapper(),
    ),
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    default_args={"retries": 0},
):

    @task
    def read_partition(
        dag_run: Any = None, partition_key: Any = None, partition_date: Any = None
    ) -> dict[str, str]:
        return {
            "dag_run.partition_key": str(dag_run.partition_key),
            "dag_run.partition_date": str(dag_run.partition_date),
            "partition_key": str(partition_key),
            "partition_date": str(partition_date),
            "current": str(get_current_context()["partition_key"]),
        }

    read_partition() >> BashOperator(
        task_id="render_partition",
        bash_command=(
            'echo "{{ partition_key }} {{ partition_date }} {{ dag_run.partition_key }} '
            '{{ dag_run.partition_date }}"'
        ),
    )


with DAG(
    "partition_regions",
    schedule=PartitionedAtRuntime(),
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    default_args={"retries": 0},
):

    @task
    def region(dag_run: Any = None) -> str:
        return f"{dag_run.partition_key} {dag_run.partition_date}"

    region()
