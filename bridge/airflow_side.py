"""Airflow's side of a whole-DAG shadow's comparison, read through Airflow's REST API.

The worker reads it as a user would trust it: the DAG run's task instances (state, duration)
and each task's XComs (every key, digested), through the api-server and its auth. Settings
(``bridge.config``): ``BRIDGE_AIRFLOW_API_URL`` (e.g. ``http://airflow-api:8080``),
``BRIDGE_AIRFLOW_API_USER`` and ``BRIDGE_AIRFLOW_API_PASSWORD`` (a user allowed to read DAG
runs, task instances and XComs), or ``[bridge] airflow_api_*`` in airflow.cfg.
"""

from __future__ import annotations

from typing import Any
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


#: Airflow's task instance states that are final (any other: the item is still at work).
FINAL_STATES = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})


def mapped_state(states: list[str]) -> str:
    """One state for a mapped task's items, as the bridge's workflow merges its items: any item
    still at work makes it ``running`` (the comparison waits), any failed one ``failed``, all
    skipped ``skipped``, else ``success`` (some items may have skipped themselves)."""
    if any(s not in FINAL_STATES for s in states):
        return "running"
    if any(s in ("failed", "upstream_failed") for s in states):
        return "failed"
    if states and all(s == "skipped" for s in states):
        return "skipped"
    return "success"


def _mapped_side(api: AirflowApi, run_path: str, tis: list[dict[str, Any]]) -> TaskSide:
    """A mapped task's items as one side: their states and return values in map index order."""
    from bridge.comparison import digest

    tis = sorted(tis, key=lambda ti: int(ti["map_index"]))
    state = mapped_state([str(ti.get("state") or "none") for ti in tis])
    values: list[Any] = []
    for ti in tis:
        path = f"{run_path}/taskInstances/{ti['task_id']}/xcomEntries/return_value"
        try:
            got = api.request("GET", path, params={"map_index": int(ti["map_index"])})
        except AirflowApiError as exc:
            if exc.status != 404:  # 404: the item pushed no return value (it returned None)
                raise
            continue
        values.append(got.get("value"))
    durations = [ti["duration"] for ti in tis if ti.get("duration") is not None]
    ms = round(sum(durations) * 1000) if durations else None
    return TaskSide(state, ms, {"return_value": digest(values)} if state == "success" else {})


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
    """Each task of the run: its state, duration and XCom digests. A mapped task is one side,
    as the bridge's result holds it: its ``return_value`` is the list of its items' return
    values in map index order (those that pushed one), its state ``success`` when every item
    succeeded (else the one state they share, or ``failed``), its duration the items' sum.

    Raises:
        AirflowSideUnavailable: no API configured, or it answered with an error.
    """
    from bridge.comparison import digest

    api = _api()
    try:
        sides: dict[str, TaskSide] = {}
        run = quote(run_id, safe="")
        mapped: dict[str, list[dict[str, Any]]] = {}
        for ti in api.task_instances(dag_id, run_id):
            if ti.get("map_index", -1) != -1:
                mapped.setdefault(ti["task_id"], []).append(ti)
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
        for task_id, tis in mapped.items():
            sides[task_id] = _mapped_side(api, f"/api/v2/dags/{dag_id}/dagRuns/{run}", tis)
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
