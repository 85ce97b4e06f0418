"""Generator callables (this project's DAG; the corpus comparison runs it in Airflow and through
the bridge): their operator's execute drains them as Airflow's task runner does, asset
``Metadata`` going to the outlet events and the generator's return value becoming the XCom; one
that raises part way fails its task."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pendulum
from airflow.sdk import Asset, Metadata, dag, task

REPORT = Asset(uri="s3://bridge-semantics/generator-report", name="bridge_generator_report")


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False)
def generator_tasks() -> None:
    @task(outlets=[REPORT])
    def with_metadata() -> Iterator[Any]:
        yield Metadata(REPORT, {"rows": 3})
        return "wrote 3 rows"

    @task
    def yields_only() -> Iterator[int]:
        yield 1  # not Metadata: Airflow logs and ignores it
        yield 2

    @task
    def fails_part_way() -> Iterator[Any]:
        yield Metadata(REPORT, {"rows": 1})
        raise RuntimeError("the generator fails on purpose")

    @task
    def after(value: str) -> str:
        return value.upper()

    after(with_metadata())
    yields_only()
    fails_part_way()


generator_tasks()
