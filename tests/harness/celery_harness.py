"""The real-Airflow harness on CeleryExecutor: two schedulers, two ``airflow celery worker``
processes (``worker-a``, ``worker-b``, Celery node names ``worker-a@<host>``), Redis or RabbitMQ
as broker, the metadata database as Celery's result backend.

The broker is a server of the fixture's own, on free ports, so the scenario that restarts the
broker restarts nobody else's: a ``redis-server`` (the same binary and flags as the machine's:
``--save "" --appendonly no``, nothing on disk), or a RabbitMQ node (the machine's
``rabbitmq-server``, its own node name, ports, config and data folder; durable queues kept on
disk, as a deployment's are). One stack per test module (``celery_airflow`` on Redis,
``rabbitmq_celery_airflow``): the scenarios share it and leave both workers running.

Airflow's Celery settings are a deployment's (``task_acks_late`` on, prefetch 1) except:

* ``visibility_timeout`` 30 s on Redis (Airflow's default is a day): a message a lost worker
  never acknowledged goes back to the queue in seconds; it also re-delivers every task that
  runs longer than 30 s while it runs, which is one of Celery's own roads to a duplicate.
  RabbitMQ has no such timeout: it hands an unacknowledged message out again as soon as the
  connection of the worker that had it closes (a worker lost, or the broker restarted);
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
from collections.abc import Iterator, Mapping
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


class RabbitMqServer:
    """A private RabbitMQ node on 127.0.0.1: its own node name, AMQP and distribution ports,
    config, data and log folders, and Erlang cookie (``HOME``), so nothing the machine's node
    has is touched (only the machine's ``epmd`` knows its name). No plugins."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="eo-rabbitmq-"))
        self.node = f"eo-{port}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The AMQP URL of the node's default vhost (``guest`` may log in from 127.0.0.1)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        (self.dir / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ", "ERL"))}
        return env | {
            "HOME": str(self.dir),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.port + 1),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.dir / "node.pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self) -> None:
        """Starts the node (its data folder kept from a previous start); waits until it
        takes AMQP connections."""
        # the package's wrapper in /usr/sbin switches to the rabbitmq user and its cookie
        binary = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
        if not binary.exists():
            found = shutil.which("rabbitmq-server")
            if found is None:
                pytest.skip("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
            binary = Path(found)
        with (self.dir / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [str(binary)],
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,  # where a crashed node writes erl_crash.dump
                start_new_session=True,
            )
        wait_until(self.answers, timeout=90, what=f"RabbitMQ node {self.node}")

    def answers(self) -> bool:
        """True when the node takes an AMQP connection."""
        import amqp
        import kombu

        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"RabbitMQ node {self.node} exited: see {self.dir / 'server.log'}")
        try:
            with kombu.Connection(self.url, connect_timeout=2) as conn:
                conn.connect()
        except (OSError, kombu.exceptions.KombuError, amqp.exceptions.AMQPError):
            return False  # not listening yet, or still booting
        return True

    def stop(self) -> None:
        """Stops the node (SIGTERM to its process group, SIGKILL after 30 s); its durable
        queues stay in its data folder for the next start."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)  # the start script ends with the node
                with contextlib.suppress(TimeoutError):
                    wait_until(lambda: not _group_alive(proc.pid), timeout=10, what="the node")
                    return

    def restart(self) -> None:
        """Stops and starts the node: connections drop, unacknowledged messages are queued
        again, durable queues keep what they held."""
        self.stop()
        self.start()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


class CeleryHarness(AirflowHarness):
    """An ``AirflowHarness`` on CeleryExecutor, with helpers for the workers and the broker."""

    def __init__(
        self,
        admin_dsn: str,
        broker: str = "redis",
        *,
        redelivery_guard: bool = True,
        dag_folders: Mapping[str, Path] | None = None,
    ) -> None:
        base = free_port_block(first=29000, last=29999, size=2)
        self.broker: RedisServer | RabbitMqServer
        if broker == "rabbitmq":
            self.broker = RabbitMqServer(base)
            self.celery = CeleryConfig(broker="rabbitmq", rabbitmq_url=self.broker.url)
        else:
            self.broker = RedisServer(base)
            self.celery = CeleryConfig(redis_port=base, visibility_timeout=VISIBILITY_TIMEOUT)
        self.celery.concurrency = 6
        self.celery.redelivery_guard = redelivery_guard
        super().__init__(
            admin_dsn, extra_env=CELERY_ENV, celery=self.celery, dag_folders=dag_folders
        )

    def start(self) -> CeleryHarness:
        """Starts the broker, then the stack."""
        self.broker.start()
        super().start()
        return self

    def stop(self) -> None:
        """Stops the stack, then the broker."""
        try:
            super().stop()
        finally:
            self.broker.stop()
            shutil.rmtree(self.broker.dir, ignore_errors=True)

    # -- workers -------------------------------------------------------------------------------

    def worker_logs(self) -> str:
        """What every Celery worker logged, worker after worker."""
        return "".join(
            (self.stack.home / f"{w}.log").read_text(errors="replace") for w in self.stack.workers
        )

    def worker_pids(self) -> dict[str, int]:
        """Worker name -> pid of the main process of each worker that is alive."""
        return {
            name: comp.pid
            for name, comp in self.stack.components.items()
            if name in self.stack.workers and comp.pid is not None and comp.alive()
        }

    def worker_of(self, procs: TaskProcesses) -> str | None:
        """The worker whose process tree runs the try ``procs``."""
        return self.worker_running(procs.supervisor)

    def worker_running(self, supervisor: int) -> str | None:
        """The worker whose process tree holds the try supervisor ``supervisor``."""
        mains = {pid: name for name, pid in self.worker_pids().items()}
        try:
            ancestors = psutil.Process(supervisor).parents()
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

    def consume(self, name: str, *, on: bool, queue: str = "default") -> None:
        """Worker ``name`` stops (``on=False``) or starts again taking tasks from ``queue``
        (Celery's ``cancel_consumer`` / ``add_consumer`` remote control, as an operator drains
        a worker): the tries it runs go on, new tasks go to the other workers."""
        from celery import Celery

        app = Celery(broker=self.celery.broker_url)
        node = self.celery.node_name(name)
        try:
            with app.connection_for_write() as conn:
                call = app.control.add_consumer if on else app.control.cancel_consumer
                replies = call(queue, destination=[node], reply=True, connection=conn)
        finally:
            app.close()
        assert replies, f"{node} did not answer {'add' if on else 'cancel'}_consumer"

    def ensure_workers(self) -> None:
        """Both workers alive and consuming on return."""
        alive = self.worker_pids()
        for name in self.stack.workers:
            if name not in alive or name in self.stack._allowed_dead:
                self.restart_worker(name)


def _module_stack(
    request: pytest.FixtureRequest, broker: str, *, redelivery_guard: bool = True
) -> Iterator[CeleryHarness]:
    harness = CeleryHarness(ADMIN_DSN, broker, redelivery_guard=redelivery_guard)
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


@pytest.fixture(scope="module")
def celery_airflow(request: pytest.FixtureRequest) -> Iterator[CeleryHarness]:
    """One Airflow stack on CeleryExecutor with Redis for the test module (``CeleryHarness``)."""
    yield from _module_stack(request, "redis")


@pytest.fixture(scope="module")
def rabbitmq_celery_airflow(request: pytest.FixtureRequest) -> Iterator[CeleryHarness]:
    """One Airflow stack on CeleryExecutor with RabbitMQ for the test module."""
    yield from _module_stack(request, "rabbitmq")


@pytest.fixture(scope="module")
def unguarded_celery_airflow(request: pytest.FixtureRequest) -> Iterator[CeleryHarness]:
    """The Redis stack with Airflow's own Celery settings, without the plugin's
    ``celery_config`` (a re-delivered copy of a running try fails that try)."""
    yield from _module_stack(request, "redis", redelivery_guard=False)


def each_test(harness: CeleryHarness) -> Iterator[CeleryHarness]:
    """Around one test on a module's stack: both schedulers and both workers running before
    it, both workers again after it (a test that killed one leaves the next a whole stack)."""
    harness.ensure_schedulers()
    harness.ensure_workers()
    yield harness
    harness.ensure_workers()
