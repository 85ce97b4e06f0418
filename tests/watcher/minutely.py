"""A per-minute, opted-in DAG on the real-Airflow harness, shared by the watcher and views tests.

The DAG file is written when a test first asks for it, with a start date a minute ahead, into
a bundle folder registered with the harness at import (before the session's stack starts), so
runs are expected only from when the test began: nothing before it can look missed.
"""

from __future__ import annotations

import dataclasses
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.harness.airflow_harness import EXTRA_DAG_FOLDERS, AirflowHarness, wait_for

FOLDER = Path(tempfile.mkdtemp(prefix="eo_watcher_dags_"))
EXTRA_DAG_FOLDERS.setdefault("watcher", FOLDER)
TASK = "backup"
DAG_TEMPLATE = textwrap.dedent(
    """
    from datetime import datetime, timezone

    from airflow.sdk import DAG, task

    with DAG(
        {dag_id!r},
        schedule="* * * * *",
        start_date=datetime({start.year}, {start.month}, {start.day}, {start.hour},
                            {start.minute}, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=3,
        tags=["exactly-once"],
    ):
        @task
        def {task}():
            return {{"rows": 1}}

        {task}()
    """
)


@dataclasses.dataclass(frozen=True)
class MinutelyDag:
    """The per-minute DAG: its id, protected task, and the minute its runs start."""

    dag_id: str
    task_id: str
    start: datetime


def succeeded_periods(harness: AirflowHarness, dag: MinutelyDag) -> list[str]:
    """The business minutes whose protected task succeeded (from the lease store)."""
    with harness.lease_store() as store:
        rows = store.list_leases(
            prefix=f"{dag.dag_id}/{dag.task_id}/", state="succeeded", limit=10_000
        )
    return sorted(row["key"].split("/")[2] for row in rows)


@pytest.fixture(scope="session")
def minutely_dag(airflow: AirflowHarness) -> Iterator[MinutelyDag]:
    """Writes, waits for and unpauses the per-minute DAG; pauses it at the end of the session."""
    now = datetime.now(UTC)
    start = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    dag = MinutelyDag(f"watched_minutely_{uuid.uuid4().hex[:8]}", TASK, start)
    (FOLDER / f"{dag.dag_id}.py").write_text(
        DAG_TEMPLATE.format(dag_id=dag.dag_id, start=start, task=TASK)
    )
    airflow.wait_for_dag(dag.dag_id, timeout=240)
    airflow.client().set_paused(dag.dag_id, False)
    try:
        yield dag
    finally:
        airflow.client().set_paused(dag.dag_id, True)


def wait_for_runs(
    harness: AirflowHarness, dag: MinutelyDag, count: int, timeout: float
) -> list[str]:
    """Waits until ``count`` runs of the DAG succeeded under their leases."""
    found: list[str] = wait_for(
        lambda: (done := succeeded_periods(harness, dag)) and len(done) >= count and done,
        timeout=timeout,
        what=f"{count} protected runs of {dag.dag_id}",
        interval=2.0,
    )
    return found
