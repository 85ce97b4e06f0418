"""A real Airflow 3 stack on one machine: two schedulers, api-server, dag-processor, triggerer.

Used by the incident replay (``exactly-once-demo``) and by the end-to-end test harness. Every
component is its own process group (``setsid``), started from an ``AIRFLOW_HOME`` in a private
folder and configured only through environment variables, so nothing leaks into the caller's
Airflow. Timeouts are shortened (see ``FAST_FAILOVER``) so that a scheduler death or a stalled
task is noticed in seconds, not minutes.

    stack = AirflowStack(metadata_dsn, dag_folders={"examples": Path("dags")}, ...)
    stack.start()
    ...
    stack.stop()
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil
import psycopg

from airflow_plugins.demo.celery_workers import CeleryConfig

ADMIN_USER = "admin"
VIEWER_USER = "viewer"

# Issue 3 measured how plain Airflow double-charges with these knobs; they only make failover
# (and so the scenarios) faster, never change what happens.
FAST_FAILOVER: dict[str, str] = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
    "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "20",
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
    "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
    "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "600",
    "AIRFLOW__API__WORKERS": "1",
    "AIRFLOW__CORE__PARALLELISM": "8",
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
    "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "60",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
}

SCHEDULERS = ("scheduler-a", "scheduler-b")


class StackError(RuntimeError):
    """A component did not start, or did not become healthy in time."""


def free_port_block(first: int = 28000, last: int = 28999, size: int = 8) -> int:
    """The first port of ``size`` consecutive free ports in ``[first, last]``.

    Starts at an offset drawn from the pid so two sessions (teammates' test runs, the demo)
    rarely probe the same block first.
    """
    blocks = list(range(first, last - size + 2, size))
    start = os.getpid() % len(blocks)
    for base in blocks[start:] + blocks[:start]:
        if all(_port_free(p) for p in range(base, base + size)):
            return base
    raise StackError(f"no {size} free consecutive ports in {first}-{last}")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(
    condition: Callable[[], Any], *, timeout: float, interval: float = 0.5, what: str = "condition"
) -> Any:
    """Polls ``condition`` until it returns a truthy value; returns that value.

    Raises:
        TimeoutError: the condition stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclasses.dataclass
class Component:
    """One running Airflow process (group) of the stack."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    pid: int | None = None

    def alive(self) -> bool:
        """True while the component's main process exists and is not a zombie."""
        if self.pid is None:
            return False
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                return stat.read().split(") ", 1)[1][0] != "Z"
        except (FileNotFoundError, IndexError):
            return False


class AirflowStack:
    """One Airflow 3 deployment made of real processes, on a Postgres metadata database.

    Args:
        metadata_dsn: libpq URL of an empty (or already migrated) metadata database.
        dag_folders: bundle name -> folder; each becomes a LocalDagBundle.
        connections: Airflow connection id -> URI, exported as ``AIRFLOW_CONN_*``.
        extra_env: more ``AIRFLOW__SECTION__KEY`` settings (e.g. the plugin's section).
        home: AIRFLOW_HOME (default: a new temporary folder, removed by ``stop``).
        port_base: first of 8 ports to listen on (default: a free block in 28000-28999).
        schedulers: how many schedulers to start (1 or 2).
        celery: run CeleryExecutor with these workers and broker (default: LocalExecutor).
    """

    def __init__(
        self,
        metadata_dsn: str,
        *,
        dag_folders: Mapping[str, Path],
        connections: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        home: Path | None = None,
        port_base: int | None = None,
        schedulers: int = len(SCHEDULERS),
        celery: CeleryConfig | None = None,
    ) -> None:
        if not 1 <= schedulers <= len(SCHEDULERS):
            raise ValueError(f"schedulers must be 1..{len(SCHEDULERS)}, not {schedulers}")
        self.schedulers = SCHEDULERS[:schedulers]
        self.metadata_dsn = metadata_dsn
        self.dag_folders = {name: Path(path).resolve() for name, path in dag_folders.items()}
        self.connections = dict(connections or {})
        self.extra_env = dict(extra_env or {})
        self._own_home = home is None
        self.home = Path(home or tempfile.mkdtemp(prefix="eo-airflow-"))
        self.celery = celery
        workers = len(celery.workers) if celery is not None else 0
        # ports: api, 2 scheduler log servers, trigger logs, 3 health checks, triggerer logs;
        # then one log server port per Celery worker
        self.port_base = port_base if port_base is not None else free_port_block(size=8 + workers)
        self.api_port = self.port_base
        self.passwords = {ADMIN_USER: secrets.token_urlsafe(12), VIEWER_USER: "viewer-pw"}
        self.components: dict[str, Component] = {}
        self._popen: dict[str, subprocess.Popen[bytes]] = {}
        # components a test killed on purpose: their death is not a stack failure
        self._allowed_dead: set[str] = set()
        self._bin = Path(sys.executable).parent / "airflow"
        self._secret = secrets.token_urlsafe(32)

    # -- configuration --------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The api-server's base URL (UI and REST API)."""
        return f"http://127.0.0.1:{self.api_port}"

    def _bundles(self) -> str:
        return json.dumps(
            [
                {
                    "name": name,
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(path), "refresh_interval": 20},
                }
                for name, path in self.dag_folders.items()
            ]
        )

    def env(self) -> dict[str, str]:
        """The environment every component (and any ``airflow`` CLI call) runs with."""
        url = psycopg.conninfo.conninfo_to_dict(self.metadata_dsn)
        sqla = "postgresql+psycopg2://{user}@{host}:{port}/{dbname}".format(
            user=url.get("user", "postgres"),
            host=url.get("host", "127.0.0.1"),
            port=url.get("port", 5432),
            dbname=url["dbname"],
        )
        if url.get("password"):
            sqla = sqla.replace("@", f":{url['password']}@", 1)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("AIRFLOW") and not k.startswith("PYTEST")
        }
        env.update(FAST_FAILOVER)
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqla,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__API__BASE_URL": self.base_url,
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__API__SECRET_KEY": self._secret,
                "AIRFLOW__API_AUTH__JWT_SECRET": self._secret,
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin,"
                f"{VIEWER_USER}:viewer",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(
                    self.home / "passwords.json"
                ),
                "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": self._bundles(),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.port_base + 1),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.port_base + 3),
                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(self.port_base + 4),
                "AIRFLOW__CORE__DAGS_FOLDER": str(next(iter(self.dag_folders.values()))),
                "PYTHONUNBUFFERED": "1",
                # a bundle sees only its own folder on sys.path; the scenario DAGs import the
                # examples' shared billing module, so every folder is importable everywhere
                "PYTHONPATH": os.pathsep.join(
                    [str(p) for p in self.dag_folders.values()]
                    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
                ),
            }
        )
        for conn_id, uri in self.connections.items():
            env[f"AIRFLOW_CONN_{conn_id.upper()}"] = uri
        if self.celery is not None:
            env.update(self.celery.env(sqla))
        env.update(self.extra_env)
        return env

    @property
    def workers(self) -> tuple[str, ...]:
        """The component names of the Celery workers (none on LocalExecutor)."""
        return tuple(self.celery.workers) if self.celery is not None else ()

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 150.0) -> AirflowStack:
        """Migrates the metadata database and starts every component; waits until healthy.

        Raises:
            StackError: a component died or did not become healthy within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps(self.passwords) + "\n")
        if self.celery is not None:
            self.celery.claim_broker(str(self.home))
        self.airflow("db", "migrate", timeout=120)
        self.start_component("api-server", "api-server", "--port", str(self.api_port))
        self.start_component("dag-processor", "dag-processor")
        for name in self.schedulers:
            self.start_scheduler(name)
        self.start_triggerer()
        for name in self.workers:
            self.start_worker(name)
        self.wait_healthy(timeout=max(5.0, deadline - time.monotonic()))
        return self

    def start_triggerer(self) -> Component:
        """Starts (or restarts) the triggerer with its own log server port."""
        return self.start_component(
            "triggerer",
            "triggerer",
            env={"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.port_base + 5)},
        )

    def start_scheduler(self, name: str) -> Component:
        """Starts (or restarts) scheduler ``name`` with its own worker log server port."""
        index = SCHEDULERS.index(name) if name in SCHEDULERS else len(self.components)
        port = self.port_base + 1 if index == 0 else self.port_base + 2
        return self.start_component(
            name,
            "scheduler",
            env={
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(port),
                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(
                    self.port_base + 6 + index
                ),
            },
        )

    def start_worker(self, name: str) -> Component:
        """Starts (or restarts) Celery worker ``name`` with its own worker log server port."""
        if self.celery is None:
            raise StackError("this stack runs LocalExecutor: it has no Celery workers")
        index = self.workers.index(name)
        # a restarted worker must not find its own log in the ready check
        (self.home / f"{name}.log").unlink(missing_ok=True)
        return self.start_component(
            name,
            *self.celery.worker_args(name),
            env={"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.port_base + 8 + index)},
        )

    def worker_ready(self, name: str) -> bool:
        """True once Celery worker ``name`` consumes from the broker: its log says so, or
        (when Airflow's logging is quieter than INFO, where Celery says it) it answers a
        ping sent through the broker."""
        if self.celery is None:
            return False
        log = self.home / f"{name}.log"
        try:
            if " ready." in log.read_text(errors="replace"):
                return True
        except FileNotFoundError:
            return False
        return self.celery.answers_ping(name)

    def start_component(
        self, name: str, *args: str, env: Mapping[str, str] | None = None
    ) -> Component:
        """Starts ``airflow <args>`` as component ``name`` in its own session."""
        old = self.components.get(name)
        if old is not None and old.alive():
            raise StackError(f"{name} is already running (pid {old.pid})")
        full_env = self.env()
        full_env.update(env or {})
        log = self.home / f"{name}.log"
        comp = Component(name, [str(self._bin), *args], full_env, log)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                comp.argv,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.home,
                start_new_session=True,
            )
        comp.pid = proc.pid
        self._popen[name] = proc
        self._allowed_dead.discard(name)
        self.components[name] = comp
        (self.home / f"{name}.pid").write_text(f"{proc.pid}\n")
        return comp

    def airflow(self, *args: str, timeout: float = 120.0) -> str:
        """Runs one ``airflow`` CLI command against this stack; returns its output.

        Raises:
            StackError: the command failed.
        """
        done = subprocess.run(
            [str(self._bin), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home,
        )
        if done.returncode != 0:
            raise StackError(
                f"airflow {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}"
            )
        return done.stdout

    def metadata(self) -> psycopg.Connection[Any]:
        """A new autocommit connection to the metadata database (read-only use, please)."""
        return psycopg.connect(self.metadata_dsn, autocommit=True)

    def running_jobs(self) -> dict[str, int]:
        """Job type -> how many jobs of that type heartbeat within the last 15 seconds."""
        with self.metadata() as conn:
            rows = conn.execute(
                "SELECT job_type, count(*) FROM job WHERE state = 'running' "
                "AND latest_heartbeat > now() - interval '15 seconds' GROUP BY job_type"
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def wait_healthy(self, timeout: float = 120.0) -> None:
        """Waits for the api-server to answer and every job to heartbeat.

        Raises:
            StackError: a component died, or the stack was not healthy within ``timeout``.
        """
        import httpx

        schedulers = sum(1 for n in SCHEDULERS if self.components.get(n, None) is not None)

        def healthy() -> bool:
            for comp in self.components.values():
                if not comp.alive() and comp.name not in self._allowed_dead:
                    raise StackError(f"{comp.name} exited; see {comp.log}:\n{_tail(comp.log)}")
            try:
                if httpx.get(f"{self.base_url}/api/v2/version", timeout=3).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
            jobs = self.running_jobs()
            if not all(self.worker_ready(n) for n in self.workers if n not in self._allowed_dead):
                return False
            return (
                jobs.get("SchedulerJob", 0) >= schedulers
                and jobs.get("TriggererJob", 0) >= 1
                and jobs.get("DagProcessorJob", 0) >= 1
            )

        wait_until(healthy, timeout=timeout, interval=1.0, what="the Airflow stack to be healthy")

    def signal(self, name: str, sig: signal.Signals, *, group: bool = False) -> None:
        """Sends ``sig`` to a component's main process (or its whole process group)."""
        comp = self.components[name]
        if comp.pid is None:
            return
        self._allowed_dead.add(name)
        if group:
            os.killpg(comp.pid, sig)
        else:
            os.kill(comp.pid, sig)

    def stop_component(self, name: str, timeout: float = 20.0) -> None:
        """Stops a component and every process of its group: SIGTERM, then SIGKILL."""
        comp = self.components.get(name)
        if comp is None or comp.pid is None:
            return
        self._allowed_dead.add(name)
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(comp.pid, sig)
            except ProcessLookupError:
                break
            if _wait_group_gone(comp.pid, wait, self._popen.get(name)):
                break
        proc = self._popen.pop(name, None)
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def processes(self) -> list[psutil.Process]:
        """Every live process of this stack, found by its ``AIRFLOW_HOME``.

        Task processes start their own session, so process groups alone miss them.
        """
        home = str(self.home)
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.pid != os.getpid() and proc.environ().get("AIRFLOW_HOME") == home:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def stop(self, *, keep_home: bool = False) -> None:
        """Stops every component and every task process; removes a temporary AIRFLOW_HOME."""
        for name in list(self.components):
            self.stop_component(name, timeout=10.0)
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        if self.celery is not None:
            self.celery.release_broker()
        if self._own_home and not keep_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> AirflowStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_group_gone(pgid: int, timeout: float, leader: subprocess.Popen[bytes] | None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()  # reap the leader, or its zombie keeps the group alive
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        time.sleep(0.2)
    return False


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
