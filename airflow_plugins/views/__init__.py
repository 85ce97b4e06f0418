"""The plugin's pages in the Airflow UI (leases, audit, runs and SLA, migration).

The plugin mounts ``create_app()`` under ``fastapi_apps`` at ``/exactly-once``.
"""

from __future__ import annotations

from airflow_plugins.views.audit_answer import RunAnswer, Verdict, answer

__all__ = ["RunAnswer", "Verdict", "answer", "create_app"]


def create_app() -> object:
    """The FastAPI app of the pages (imports Airflow's API server, so only on demand)."""
    from airflow_plugins.views.app import create_app as build

    return build()
