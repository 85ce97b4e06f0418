"""Airflow's side of a whole-DAG shadow's comparison, read through Airflow's REST API.

The worker reads it as a user would trust it: the DAG run's task instances (state, duration)
and each task's XComs (every key, digested), through the api-server and its auth. Settings
(``bridge.config``): ``BRIDGE_AIRFLOW_API_URL`` (e.g. ``http://airflow-api:8080``),
``BRIDGE_AIRFLOW_API_USER`` and ``BRIDGE_AIRFLOW_API_PASSWORD`` (a user allowed to read DAG
runs, task instances and XComs), or ``[bridge] airflow_api_*`` in airflow.cfg.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx

from airflow_plugins.demo.airflow_api import AirflowApi, AirflowApiError
from airflow_plugins.lease.masking import mask_text
from bridge.task_comparison import TaskSide

#: A whole-DAG shadow's ``source``: ``airflow-dagrun:<Airflow run id>`` (what it compares with).
SOURCE_PREFIX = "airflow-dagrun:"


class AirflowSideUnavailable(RuntimeError):
    """No Airflow API is configured, or it did not answer: the comparison waits (and says why)."""


class AirflowSideRefused(RuntimeError):
    """Airflow's API refused the worker's credentials (401/403): waiting cannot help, so the
    comparison stops at once with this reason (the user's name, never the password)."""


#: HTTP statuses that mean the credentials are wrong or not allowed to read the run.
REFUSED = (401, 403)


def run_id_of(source: str) -> str | None:
    """The Airflow run id a whole-DAG shadow compares with, or None (another kind of run)."""
    return source.removeprefix(SOURCE_PREFIX) if source.startswith(SOURCE_PREFIX) else None


def _api() -> AirflowApi:
    from bridge.config import BridgeConfig

    config = BridgeConfig.load()
    if not config.airflow_api_url:
        raise AirflowSideUnavailable("BRIDGE_AIRFLOW_API_URL is not set")
    return AirflowApi(
        config.airflow_api_url, config.airflow_api_user or "", config.airflow_api_password or ""
    )


def airflow_tasks(dag_id: str, run_id: str) -> dict[str, TaskSide]:
    """Each (unmapped) task of the run: its state, duration and XCom digests.

    Raises:
        AirflowSideUnavailable: no API configured, or it answered with an error.
    """
    from bridge.comparison import digest

    api = _api()
    try:
        sides: dict[str, TaskSide] = {}
        run = quote(run_id, safe="")
        for ti in api.task_instances(dag_id, run_id):
            if ti.get("map_index", -1) != -1:
                continue
            task_id = ti["task_id"]
            state = str(ti.get("state") or "none")
            duration = ti.get("duration")
            xcoms: dict[str, str] = {}
            if state == "success":
                base = f"/api/v2/dags/{dag_id}/dagRuns/{run}/taskInstances/{task_id}/xcomEntries"
                listed = api.request("GET", base, params={"limit": 1000})
                for entry in listed.get("xcom_entries", []):
                    key = entry["key"]
                    got = api.request("GET", f"{base}/{quote(key, safe='')}")
                    xcoms[key] = digest(got.get("value"))
            sides[task_id] = TaskSide(
                state, round(duration * 1000) if duration is not None else None, xcoms
            )
        return sides
    except AirflowApiError as exc:
        if exc.status in REFUSED:
            raise AirflowSideRefused(
                mask_text(
                    f"Airflow's API at {api.base_url} refused user {api.username!r} "
                    f"({exc.status}): check BRIDGE_AIRFLOW_API_USER / BRIDGE_AIRFLOW_API_PASSWORD"
                    " and that the user may read DAG runs, task instances and XComs"
                )
            ) from exc
        raise AirflowSideUnavailable(mask_text(str(exc))) from exc
    except (httpx.HTTPError, OSError) as exc:  # unreachable, timed out, reset
        raise AirflowSideUnavailable(mask_text(f"Airflow's API at {api.base_url}: {exc}")) from exc
    finally:
        api.close()
