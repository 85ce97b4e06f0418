"""End-to-end scenarios share one real Airflow stack per session (``tests.harness``)."""

from __future__ import annotations

from tests.harness.fixtures import airflow, business_date

__all__ = ["airflow", "business_date"]
