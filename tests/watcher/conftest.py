"""The watcher's end-to-end test runs on the shared real-Airflow harness (``tests.harness``)."""

from __future__ import annotations

from tests.harness.fixtures import airflow
from tests.watcher.minutely import minutely_dag

__all__ = ["airflow", "minutely_dag"]
