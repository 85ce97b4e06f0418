"""The real-Airflow harness on CeleryExecutor: two schedulers, two ``airflow celery worker``
processes (``worker-a``, ``worker-b``, Celery node names ``worker-a@<host>``), Redis as broker,
the metadata database as Celery's result backend.

The broker is a Redis server of the fixture's own (the same ``redis-server`` binary and flags as
the machine's: ``--save "" --appendonly no``, nothing on disk), on a free port, so the scenario
that restarts the broker restarts nobody else's Redis. One stack per test module
(``celery_airflow``): the scenarios share it and leave both workers running.

Airflow's Celery settings are a deployment's (``task_acks_late`` on, prefetch 1) except:

* ``visibility_timeout`` 30 s (Airflow's default is a day): a message a lost worker never
  acknowledged goes back to the queue in seconds; it also re-delivers every task that runs
  longer than 30 s while it runs, which is one of Celery's own roads to a duplicate;
* ``[scheduler] task_queued_timeout`` 30 s (Airflow's default is 600 s): this Redis keeps
  nothing on disk, so a restart drops the queued messages, and only this timeout makes the
  scheduler queue those task instances again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from airflow_plugins.demo.celery_workers import CeleryConfig
from airflow_plugins.demo.stack import free_port_block, wait_until
from airflow_plugins.demo.task_processes import TaskProcesses
from tests.conftest import ADMIN_DSN
from tests.harness.airflow_harness import AirflowHarness
from tests.harness.fixtures import keep_logs

VISIBILITY_TIMEOUT = 30
QUEUED_TIMEOUT = 30
CELERY_ENV = {
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT),
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "5",
}


class RedisServer:
    """A private ``redis-server`` on 127.0.0.1 that keeps nothing on disk."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="eo-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Starts the server; waits until it answers."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        argv = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(self.dir)]
        argv += ["--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)
        wait_until(self.answers, timeout=30, what=f"redis-server on {self.port}")

    def answers(self) -> bool:
        """True when the server answers PING."""
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """Stops the server (by its pid) and forgets everything it held."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Kills and starts the server: every queued and unacknowledged message is gone."""
        self.stop()
        self.start()


class CeleryHarness(AirflowHarness):
    """An ``AirflowHarness`` on CeleryExecutor, with helpers for the workers and the broker."""

    def __init__(self, admin_dsn: str) -> None:
        base = free_port_block(first=29000, last=29999, size=1)
        self.redis = RedisServer(base)
        self.celery = CeleryConfig(
            redis_port=base, visibility_timeout=VISIBILITY_TIMEOUT, concurrency=6
        )
        super().__init__(admin_dsn, extra_env=CELERY_ENV, celery=self.celery)

    def start(self) -> CeleryHarness:
        """Starts Redis, then the stack."""
        self.redis.start()
        super().start()
        return self

    def stop(self) -> None:
        """Stops the stack, then Redis."""
        try:
            super().stop()
        finally:
            self.redis.stop()
            shutil.rmtree(self.redis.dir, ignore_errors=True)

    # -- workers -------------------------------------------------------------------------------

    def worker_pids(self) -> dict[str, int]:
        """Worker name -> pid of the main process of each worker that is alive."""
        return {
            name: comp.pid
            for name, comp in self.stack.components.items()
            if name in self.stack.workers and comp.pid is not None and comp.alive()
        }

    def worker_of(self, procs: TaskProcesses) -> str | None:
        """The worker whose process tree runs the try ``procs``."""
        mains = {pid: name for name, pid in self.worker_pids().items()}
        try:
            ancestors = psutil.Process(procs.supervisor).parents()
        except psutil.NoSuchProcess:
            return None
        return next((mains[p.pid] for p in ancestors if p.pid in mains), None)

    def worker_tree(self, name: str) -> list[int]:
        """The pids of worker ``name``: its main process, pool processes, supervisors and the
        task processes they run (what a worker machine's loss takes away)."""
        pid = self.stack.components[name].pid
        if pid is None:
            return []
        try:
            main = psutil.Process(pid)
            return [pid, *(c.pid for c in main.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def signal_worker(self, name: str, sig: signal.Signals) -> list[int]:
        """Sends ``sig`` to every process of worker ``name``; returns their pids."""
        pids = self.worker_tree(name)
        self.stack._allowed_dead.add(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def restart_worker(self, name: str) -> None:
        """Stops worker ``name`` (if it still runs) and starts it again; waits until ready."""
        for pid in self.worker_tree(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.stack.stop_component(name, timeout=10.0)
        self.stack.start_worker(name)
        wait_until(lambda: self.stack.worker_ready(name), timeout=90, what=f"{name} to be ready")

    def ensure_workers(self) -> None:
        """Both workers alive and consuming on return."""
        alive = self.worker_pids()
        for name in self.stack.workers:
            if name not in alive or name in self.stack._allowed_dead:
                self.restart_worker(name)


@pytest.fixture(scope="module")
def celery_airflow(request: pytest.FixtureRequest) -> Iterator[CeleryHarness]:
    """One Airflow stack on CeleryExecutor for the test module (see ``CeleryHarness``)."""
    harness = CeleryHarness(ADMIN_DSN)
    try:
        harness.start()
    except BaseException:
        harness.stop()
        raise
    failed_before = request.session.testsfailed
    try:
        yield harness
    finally:
        if request.session.testsfailed > failed_before:
            keep_logs(harness.stack.home)
        harness.stop()
