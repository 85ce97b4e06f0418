"""The real-Airflow test harness: one Airflow 3.3 stack per test session.

Two schedulers (LocalExecutor), api-server, dag-processor and triggerer on a fresh metadata
database of the test Postgres server (``tests/conftest.py``), with a lease-store database and a
billing database wired in as Airflow Connections (``exactly_once_leases``, ``billing_db``). DAGs
come from the repository's ``dags/`` (bundle ``examples``) and ``tests/e2e/dags`` (bundle
``scenarios``); more folders can be added with ``EXTRA_DAG_FOLDERS`` before the session starts.

Failover timeouts are shortened as issue 3 measured (``airflow_plugins.demo.stack.FAST_FAILOVER``:
scheduler health threshold 15 s, orphan check 5 s, task heartbeat timeout 20 s, detection 2 s)
and leases live 10 s (renewed every 2 s), so a scenario takes tens of seconds, not minutes.

Use it from a test module or conftest::

    from tests.harness.fixtures import airflow  # noqa: F401  (the session fixture)

    def test_something(airflow: AirflowHarness) -> None:
        day = airflow.fresh_business_date()
        run_id = airflow.trigger_dag_run("billing_nightly", {"business_date": day})
        airflow.wait_for_task_state("billing_nightly", run_id, "charge", {"running"})
        procs = airflow.wait_for_task_processes("billing_nightly", run_id, "charge")
        os.kill(procs.task, signal.SIGSTOP)
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import os
import signal
import time
from collections.abc import Collection, Iterator, Mapping
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from airflow_plugins.demo.airflow_api import AirflowApi, AirflowApiError
from airflow_plugins.demo.celery_workers import CeleryConfig
from airflow_plugins.demo.deployment import BillingDeployment
from airflow_plugins.demo.stack import ADMIN_USER, SCHEDULERS, VIEWER_USER, wait_until
from airflow_plugins.demo.task_processes import TaskProcesses, find_task_processes
from airflow_plugins.lease import LeaseStore

REPO = Path(__file__).resolve().parents[2]
DAG_FOLDERS: dict[str, Path] = {
    "examples": REPO / "dags",
    "scenarios": REPO / "tests" / "e2e" / "dags",
}
# Teammates' suites may add bundles (name -> folder) and Airflow settings (env name -> value)
# here, at import time of their conftest, before the session fixture starts the stack.
EXTRA_DAG_FOLDERS: dict[str, Path] = {}
EXTRA_ENV: dict[str, str] = {}

_POLICY_SHIM = '''"""Written by the test harness: the package's entry points are not installed."""
from airflow_plugins.protection.policy import task_policy  # noqa: F401
'''
_PLUGIN_SHIM = '''"""Written by the test harness: the package's entry points are not installed."""
from airflow_plugins.protection.plugin import ExactlyOncePlugin  # noqa: F401
'''


def _has_entry_point(group: str) -> bool:
    return any(
        ep.value.startswith("airflow_plugins")
        for ep in importlib.metadata.entry_points(group=group)
    )


class AirflowHarness:
    """A running Airflow stack plus the helpers scenarios need.

    Attributes:
        deployment: databases and stack (``metadata_dsn``, ``lease_dsn``, ``sink_dsn``).
        api: REST client logged in as the admin user.
        base_url: the api-server's URL.
        admin: (username, password) of an Admin user.
        viewer: (username, password) of a Viewer user.
    """

    def __init__(
        self,
        admin_dsn: str,
        *,
        extra_env: Mapping[str, str] | None = None,
        celery: CeleryConfig | None = None,
        dag_folders: Mapping[str, Path] | None = None,
    ) -> None:
        folders = {**DAG_FOLDERS, **EXTRA_DAG_FOLDERS, **(dag_folders or {})}
        env = {**EXTRA_ENV, **(extra_env or {})}
        self.deployment = BillingDeployment(
            admin_dsn, dag_folders=folders, extra_env=env, celery=celery
        )
        self.stack = self.deployment.create()
        self._install_shims()
        self.api: AirflowApi | None = None
        # from 3 days back: the scheduler's own latest scheduled run of a daily DAG holds
        # today's or (before its hour) yesterday's business date, and would hold a test's run
        self._dates = itertools.count(3)
        self._signaled: set[str] = set()
        self._today = date.today()

    def _install_shims(self) -> None:
        """Until ``pip install`` registers the plugin's entry points, load them from
        AIRFLOW_HOME (airflow_local_settings + plugins folder): same code, other door."""
        home = self.stack.home
        if not _has_entry_point("airflow.policy"):
            (home / "config").mkdir(parents=True, exist_ok=True)
            (home / "config" / "airflow_local_settings.py").write_text(_POLICY_SHIM)
        plugin = REPO / "airflow_plugins" / "plugin.py"
        if not _has_entry_point("airflow.plugins") and plugin.exists():
            (home / "plugins").mkdir(parents=True, exist_ok=True)
            (home / "plugins" / "exactly_once_shim.py").write_text(_PLUGIN_SHIM)

    def start(self) -> AirflowHarness:
        """Starts the stack and waits until every DAG of the bundles is parsed."""
        self.stack.start()
        self.api = AirflowApi(self.base_url, *self.admin)
        return self

    def stop(self) -> None:
        """Stops every process of the stack and drops its databases."""
        if self.api is not None:
            self.api.close()
        self.deployment.destroy()

    # -- identity ------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The api-server's base URL (REST API under /api/v2, UI at /)."""
        return self.stack.base_url

    @property
    def admin(self) -> tuple[str, str]:
        """Admin credentials (simple auth manager)."""
        return ADMIN_USER, self.stack.passwords[ADMIN_USER]

    @property
    def viewer(self) -> tuple[str, str]:
        """Viewer credentials (simple auth manager)."""
        return VIEWER_USER, self.stack.passwords[VIEWER_USER]

    @property
    def metadata_dsn(self) -> str:
        """Airflow's metadata database (read it, never write it)."""
        return self.deployment.metadata_dsn

    @property
    def lease_dsn(self) -> str:
        """The lease store's database (Connection ``exactly_once_leases``)."""
        return self.deployment.lease_dsn

    @property
    def sink_dsn(self) -> str:
        """The billing database (Connection ``billing_db``)."""
        return self.deployment.sink_dsn

    def client(self) -> AirflowApi:
        """The admin REST client."""
        assert self.api is not None, "the harness is not started"
        return self.api

    # -- runs ----------------------------------------------------------------------------------

    def fresh_business_date(self) -> str:
        """A business date no other scenario of this session uses (recent, so within the
        lease store's retention horizon)."""
        return (self._today - timedelta(days=next(self._dates))).isoformat()

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> dict[str, Any]:
        """Waits until the dag-processor has parsed ``dag_id``; returns its details."""

        def parsed() -> dict[str, Any] | None:
            try:
                return self.client().dag(dag_id)
            except AirflowApiError:
                return None

        try:
            found: dict[str, Any] = wait_until(parsed, timeout=timeout, what=f"DAG {dag_id}")
        except TimeoutError as exc:
            errors = self.client().import_errors()
            raise TimeoutError(f"{exc}; import errors: {errors}") from exc
        return found

    def trigger_dag_run(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None = None,
        logical_date: datetime | None = None,
        *,
        run_id: str | None = None,
        partition_key: str | None = None,
    ) -> str:
        """Unpauses and triggers ``dag_id`` (one asset partition of it, with ``partition_key``);
        returns the new run's id."""
        self.wait_for_dag(dag_id)
        return self.client().trigger_dag_run(
            dag_id, conf, logical_date, run_id=run_id, partition_key=partition_key
        )

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
        """Polls the REST API until the task instance is in ``states`` (try >= ``min_try``)."""
        return self.client().wait_for_task_state(
            dag_id, run_id, task_id, states, timeout=timeout, min_try=min_try
        )

    def wait_for_run_state(
        self,
        dag_id: str,
        run_id: str,
        states: Collection[str] = ("success", "failed"),
        *,
        timeout: float = 240.0,
    ) -> dict[str, Any]:
        """Polls until the DAG run is in ``states``; returns it."""
        return self.client().wait_for_run_state(dag_id, run_id, states, timeout=timeout)

    def clear_task(self, dag_id: str, run_id: str, task_id: str) -> None:
        """Clears a task instance through the REST API (the UI's Clear), even while it runs."""
        self.client().clear_task(dag_id, run_id, task_id)

    def task_tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """The task instance's tries so far (try history)."""
        return self.client().task_tries(dag_id, run_id, task_id)

    # -- processes -----------------------------------------------------------------------------

    def scheduler_pids(self) -> dict[str, int]:
        """Scheduler name -> pid of the schedulers that are alive."""
        return {
            name: comp.pid
            for name, comp in self.stack.components.items()
            if name in SCHEDULERS and comp.pid is not None and comp.alive()
        }

    def task_processes(
        self, dag_id: str, run_id: str, task_id: str, map_index: int = -1
    ) -> TaskProcesses | None:
        """Supervisor and task pids of the running try (and its scheduler), or None."""
        return find_task_processes(
            self.metadata_dsn,
            dag_id,
            run_id,
            task_id,
            map_index=map_index,
            scheduler_pids=self.scheduler_pids().values(),
        )

    def wait_for_task_processes(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        *,
        map_index: int = -1,
        min_try: int = 1,
        timeout: float = 120.0,
    ) -> TaskProcesses:
        """Waits until a try >= ``min_try`` of the task has live processes; returns them."""

        def found() -> TaskProcesses | None:
            procs = self.task_processes(dag_id, run_id, task_id, map_index)
            return procs if procs is not None and procs.try_number >= min_try else None

        procs: TaskProcesses = wait_until(
            found, timeout=timeout, interval=0.3, what=f"processes of {dag_id}.{task_id}"
        )
        return procs

    def scheduler_name(self, pid: int | None) -> str | None:
        """The name of the scheduler with ``pid``."""
        return next((n for n, p in self.scheduler_pids().items() if p == pid), None)

    def kill_scheduler(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Sends ``sig`` to one scheduler's main process only (its executor workers and task
        processes survive, as when a pod's main container is killed)."""
        self.stack.signal(name, sig)
        self._signaled.add(name)

    def stop_scheduler(self, name: str) -> None:
        """Stops one scheduler and every process of its group (graceful, then SIGKILL)."""
        self.stack.stop_component(name, timeout=30.0)

    def start_scheduler(self, name: str, *, wait: bool = True) -> None:
        """(Re)starts scheduler ``name``; waits until it heartbeats."""
        comp = self.stack.components.get(name)
        if comp is not None and comp.alive():
            return
        before = self._scheduler_job_ids()
        self.stack.start_scheduler(name)
        if wait:
            wait_until(
                lambda: self._scheduler_job_ids() - before,
                timeout=90,
                what=f"{name} to heartbeat",
            )

    def ensure_schedulers(self) -> None:
        """Restarts any scheduler a scenario killed; both are alive on return."""
        for name in SCHEDULERS:
            comp = self.stack.components.get(name)
            # a scheduler sent SIGTERM may linger (waiting for its tasks) without scheduling
            if comp is None or not comp.alive() or name in self._signaled:
                self.stack.stop_component(name, timeout=5.0)
                self._signaled.discard(name)
                self.start_scheduler(name)

    def _scheduler_job_ids(self) -> set[int]:
        with psycopg.connect(self.metadata_dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT id FROM job WHERE job_type = 'SchedulerJob' AND state = 'running' "
                "AND latest_heartbeat > now() - interval '10 seconds'"
            ).fetchall()
        return {int(r[0]) for r in rows}

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1
    ) -> str:
        """The text of one try's task log (LocalExecutor writes it under AIRFLOW_HOME/logs)."""
        folder = self.stack.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        folder = folder / f"task_id={task_id}"
        if map_index >= 0:
            folder = folder / f"map_index={map_index}"
        path = folder / f"attempt={try_number}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- data ----------------------------------------------------------------------------------

    def charges(self, business_date: str) -> list[dict[str, Any]]:
        """The billing database's charge rows for ``business_date`` (oldest first)."""
        return self.deployment.charges(business_date)

    def processor_charges(self, business_date: str) -> list[dict[str, Any]]:
        """The charges the payment processor made for ``business_date`` (oldest first)."""
        return self.deployment.processor_charges(business_date)

    @contextlib.contextmanager
    def lease_store(self) -> Iterator[LeaseStore]:
        """A lease store client on the stack's lease database."""
        with LeaseStore(self.lease_dsn) as store:
            yield store


def wait_for(condition: Any, *, timeout: float, what: str, interval: float = 0.5) -> Any:
    """Polls ``condition()`` until truthy (generous deadlines; never a fixed sleep)."""
    return wait_until(condition, timeout=timeout, interval=interval, what=what)


def sleep_at_least(seconds: float) -> None:
    """For waits that are the point of the scenario (a process paused past its lease)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def signal_pids(pids: Collection[int], sig: signal.Signals) -> None:
    """Sends ``sig`` to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
