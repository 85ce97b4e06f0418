"""The Airflow plugin: registers the listener and mounts the UI pages.

Registered through the ``airflow.plugins`` entry point (``exactly_once =
airflow_plugins.protection.plugin:ExactlyOncePlugin``), so installing the package is all it takes;
the cluster policy has its own entry point (``airflow.policy``). Options live in the
``[exactly_once]`` section (``airflow_plugins.protection.config``).

The pages app (``airflow_plugins.views.app:create_app``) is built only when the API server asks
for it, not in every scheduler and task process that loads plugins for their listeners; when it
cannot be built the listener still loads and the error is logged.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_plugins.protection import listener

log = logging.getLogger(__name__)

URL_PREFIX = "/exactly-once"
VIEWS_MODULE = "airflow_plugins.views.app"


@functools.cache
def views_app() -> list[dict[str, Any]]:
    """The ``fastapi_apps`` entry of the pages, or nothing when they are not installed."""
    try:
        if importlib.util.find_spec(VIEWS_MODULE) is None:
            return []
    except ModuleNotFoundError:  # the parent package is missing (a trimmed install)
        return []
    try:
        module = importlib.import_module(VIEWS_MODULE)
        app = module.create_app()
    except Exception:
        log.exception("exactly-once: the UI pages could not be built; listener still active")
        return []
    return [{"app": app, "url_prefix": URL_PREFIX, "name": "Exactly-once"}]


def menu_entries() -> list[dict[str, Any]]:
    """The UI's navigation entries for the pages (the views module's own, if it has them)."""
    if not views_app():
        return []
    module = importlib.import_module(VIEWS_MODULE)
    entries = getattr(module, "EXTERNAL_VIEWS", None)
    if entries:
        return list(entries)
    return [
        {
            "name": "Exactly-once",
            "href": f"{URL_PREFIX}/leases",
            "url_route": "exactly-once",
            "category": "browse",
            "destination": "nav",
        },
        {
            # a tab on each DAG run: its work handed to Temporal, task by task
            "name": "Temporal tasks",
            "href": f"{URL_PREFIX}/handover?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
            "url_route": "temporal-tasks",  # Airflow shows a DAG run's tab only with a route
            "destination": "dag_run",
        },
    ]


class ExactlyOncePlugin(AirflowPlugin):
    """Run-leases for exactly-once business effects: listener and UI pages."""

    name = "exactly_once"
    listeners = [listener]  # noqa: RUF012 (Airflow reads these class attributes)

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The pages app, built on first use."""
        return views_app()

    @property
    def external_views(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The pages' menu entry."""
        return menu_entries()
