"""A small client of Airflow 3's public REST API (``/api/v2``), as a user or operator calls it.

The demo and the test harness drive Airflow only the way people do: trigger a run, clear a
task, read states. Authentication is the simple auth manager's ``/auth/token``.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import httpx

TERMINAL_TASK_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
TERMINAL_RUN_STATES = frozenset({"success", "failed"})


class AirflowApiError(RuntimeError):
    """The API answered with an error status (``status``: the HTTP status, when it had one)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AirflowApi:
    """An authenticated session on one api-server.

    Args:
        base_url: e.g. ``http://127.0.0.1:28000``.
        username: a simple-auth-manager user.
        password: that user's password.
    """

    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.username = username
        self._password = password
        self._client = httpx.Client(base_url=self.base_url, timeout=30.0)
        self._token: str | None = None

    def close(self) -> None:
        """Closes the HTTP connection pool."""
        self._client.close()

    def token(self) -> str:
        """A JWT for this user (fetched once, then reused)."""
        if self._token is None:
            resp = self._client.post(
                "/auth/token", json={"username": self.username, "password": self._password}
            )
            if resp.status_code not in (200, 201):
                raise AirflowApiError(
                    f"login as {self.username} failed: {resp.text}", resp.status_code
                )
            self._token = str(resp.json()["access_token"])
        return self._token

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Calls the API; returns the decoded JSON body (None when empty).

        Raises:
            AirflowApiError: the status is 400 or more.
        """
        headers = {"Authorization": f"Bearer {self.token()}"}
        resp = self._client.request(method, path, headers=headers, **kwargs)
        if resp.status_code >= 400:
            raise AirflowApiError(
                f"{method} {path} -> {resp.status_code}: {resp.text[:2000]}", resp.status_code
            )
        return resp.json() if resp.content else None

    # -- DAGs and runs -------------------------------------------------------------------------

    def dag(self, dag_id: str) -> dict[str, Any]:
        """The DAG's details (404 -> AirflowApiError while it is not parsed yet)."""
        result: dict[str, Any] = self.request("GET", f"/api/v2/dags/{dag_id}")
        return result

    def is_parsed(self, dag_id: str) -> bool:
        """Whether the api-server knows the DAG yet (the dag-processor has parsed it)."""
        try:
            self.dag(dag_id)
        except AirflowApiError:
            return False
        return True

    def set_paused(self, dag_id: str, paused: bool) -> None:
        """Pauses or unpauses a DAG."""
        self.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": paused})

    def import_errors(self) -> list[dict[str, Any]]:
        """The DAG import errors Airflow currently reports."""
        body = self.request("GET", "/api/v2/importErrors", params={"limit": 100})
        errors: list[dict[str, Any]] = body["import_errors"]
        return errors

    def trigger_dag_run(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None = None,
        logical_date: datetime | None = None,
        *,
        run_id: str | None = None,
        unpause: bool = True,
        partition_key: str | None = None,
    ) -> str:
        """Triggers a DAG run (unpausing the DAG first); returns its run id.

        ``logical_date=None`` is a manual run with no logical date, as Airflow 3's UI makes;
        ``partition_key`` a run of one asset partition of a partitioned DAG (Airflow 3.3).
        """
        if unpause:
            self.set_paused(dag_id, False)
        body: dict[str, Any] = {
            "conf": dict(conf or {}),
            "logical_date": logical_date.isoformat() if logical_date else None,
        }
        if run_id is not None:
            body["dag_run_id"] = run_id
        if partition_key is not None:
            body["partition_key"] = partition_key
        run = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json=body)
        return str(run["dag_run_id"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """One DAG run."""
        run: dict[str, Any] = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        return run

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of a run (mapped ones included)."""
        body = self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000}
        )
        tis: list[dict[str, Any]] = body["task_instances"]
        return tis

    def task_tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """The tries of a task instance so far (the try history)."""
        body = self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries"
        )
        tries: list[dict[str, Any]] = body["task_instances"]
        return tries

    def task_state(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any] | None:
        """The (unmapped) task instance, or None before the scheduler created it."""
        for ti in self.task_instances(dag_id, run_id):
            if ti["task_id"] == task_id and ti.get("map_index", -1) == -1:
                return ti
        return None

    def clear_task(
        self, dag_id: str, run_id: str, task_id: str, map_index: int | None = None
    ) -> None:
        """Clears one task instance of a run (as the UI's "Clear" does), even if it runs; of a
        mapped task, the one at ``map_index`` (None: every one)."""
        self.request(
            "POST",
            f"/api/v2/dags/{dag_id}/clearTaskInstances",
            json={
                "dry_run": False,
                "dag_run_id": run_id,
                "task_ids": [task_id if map_index is None else [task_id, map_index]],
                "only_failed": False,
                "only_running": False,
                "reset_dag_runs": True,
                "include_downstream": False,
                "include_upstream": False,
            },
        )

    def set_task_state(
        self, dag_id: str, run_id: str, task_id: str, state: str, map_index: int | None = None
    ) -> None:
        """Sets one task instance's state (the UI's "Mark as failed" / "success"), even if it
        runs; of a mapped task, the one at ``map_index``."""
        item = "" if map_index is None else f"/{map_index}"
        self.request(
            "PATCH",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}{item}",
            json={"new_state": state},
        )

    # -- waiting -------------------------------------------------------------------------------

    def wait_for_task_state(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        states: Collection[str],
        *,
        timeout: float = 180.0,
        min_try: int = 1,
    ) -> dict[str, Any]:
        """Polls until the task instance is in one of ``states`` with try >= ``min_try``.

        Raises:
            TimeoutError: it did not get there in time (the message gives the last state seen).
        """
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            last = self.task_state(dag_id, run_id, task_id)
            if last and last["state"] in states and int(last.get("try_number") or 0) >= min_try:
                return last
            time.sleep(0.5)
        seen = (last or {}).get("state"), (last or {}).get("try_number")
        raise TimeoutError(
            f"{dag_id}/{run_id}/{task_id} not in {sorted(states)} (try >= {min_try}) after "
            f"{timeout:.0f}s; last seen (state, try) = {seen}"
        )

    def wait_for_run_state(
        self,
        dag_id: str,
        run_id: str,
        states: Collection[str] = TERMINAL_RUN_STATES,
        *,
        timeout: float = 240.0,
    ) -> dict[str, Any]:
        """Polls until the DAG run is in one of ``states``; returns it.

        Raises:
            TimeoutError: it did not get there in time.
        """
        deadline = time.monotonic() + timeout
        run: dict[str, Any] = {}
        while time.monotonic() < deadline:
            run = self.dag_run(dag_id, run_id)
            if run["state"] in states:
                return run
            time.sleep(1.0)
        raise TimeoutError(
            f"run {dag_id}/{run_id} not in {sorted(states)} after {timeout:.0f}s "
            f"(last: {run.get('state')})"
        )
