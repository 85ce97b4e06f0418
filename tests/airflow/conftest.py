"""Fixtures for the plugin's operator, policy, listener and trigger tests.

These run the plugin's code in this process against the real Postgres lease store and a real
sink database. What needs Airflow's own processes (a scheduler deferring the task, the triggerer
running the trigger, retries, listeners firing in the scheduler) is covered by the end-to-end
tests on the harness (tests/e2e). The one thing faked here is the task runner's context: a
``RuntimeTaskInstance`` needs a supervisor, so ``context`` carries plain objects with the same
attributes (dag_id, run_id, task_id, map_index, try_number, conf, logical date...), around a
real parsed DAG.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("AIRFLOW_HOME", os.path.join(tempfile.gettempdir(), "eo_b_airflow_home"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

# engineer B's port range: 26000-26999
PORT_FIRST, PORT_LAST = 26000, 26999


def closed_port() -> int:
    """A port of B's range where nothing listens (an unreachable lease store)."""
    for port in range(PORT_LAST, PORT_LAST - 20, -1):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError("no closed port in 26980-26999")


def free_port() -> int:
    """A port of B's range that can be bound now."""
    for port in range(PORT_FIRST, PORT_LAST - 20):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in B's range")


@pytest.fixture(autouse=True)
def _plugin_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no cached lease store, the default router and no env config."""
    from airflow.sdk.bases.operator import ExecutorSafeguard

    from airflow_plugins.protection import config, connection_warmup, early_acquire, routing

    for name in list(os.environ):
        if name.startswith("AIRFLOW__EXACTLY_ONCE__") or name.startswith("AIRFLOW_CONN_"):
            monkeypatch.delenv(name)
    # operators are executed directly here, not by the task runner
    monkeypatch.setattr(ExecutorSafeguard, "test_mode", True)
    routing.register_router(None)
    monkeypatch.setattr(connection_warmup, "_started", False)
    monkeypatch.setattr(connection_warmup, "_task", None)
    early_acquire.forget()
    config._conf_cache.clear()
    yield
    routing.register_router(None)
    with config._stores_lock:
        stores = list(config._stores.values())
        config._stores.clear()
        config._task_dsns.clear()
    for store in stores:
        store.close()


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch, lease_db: str, sink_db: str) -> dict[str, str]:
    """The plugin configured on a fresh lease store, with the sink as Connection ``sink``."""
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__LEASE_DSN", lease_db)
    # the scenario's business date is the incident's (2024-02-15): older than the default
    # retention horizon of 400 days on today's clock
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__HORIZON_DAYS", "4000")
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__TTL", "5")
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__HEARTBEAT", "0.5")
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__WAIT_POLL_INTERVAL", "0.2")
    # no scheduler here to race a quick resume (wait_at_least has tests of its own)
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__WAIT_AT_LEAST", "0")
    monkeypatch.setenv("AIRFLOW_CONN_SINK", conn_uri(sink_db))
    return {"lease": lease_db, "sink": sink_db}


def conn_uri(dsn: str) -> str:
    """An Airflow Connection URI (``postgres://user@host:port/db``) for a libpq DSN."""
    import psycopg

    d = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = str(d.get("user", "postgres"))
    if d.get("password"):
        auth += f":{d['password']}"
    return f"postgres://{auth}@{d.get('host', '127.0.0.1')}:{d.get('port', 5432)}/{d['dbname']}"


def task_context(
    task: Any,
    *,
    run_id: str = "scheduled__2024-02-15T02:00:00+00:00",
    logical_date: datetime | None = None,
    conf: dict[str, Any] | None = None,
    try_number: int = 1,
    map_index: int = -1,
    rendered_map_index: str | None = None,
    triggering_user: str | None = None,
) -> dict[str, Any]:
    """The runtime context of one try of ``task`` (a task of a real DAG)."""
    dag = task.dag
    ti = SimpleNamespace(
        dag_id=dag.dag_id,
        task_id=task.task_id,
        run_id=run_id,
        map_index=map_index,
        try_number=try_number,
        rendered_map_index=rendered_map_index,
    )
    dag_run = SimpleNamespace(
        dag_id=dag.dag_id,
        run_id=run_id,
        conf=conf or {},
        logical_date=logical_date,
        start_date=logical_date,
        run_type="manual" if logical_date is None else "scheduled",
        triggering_user_name=triggering_user,
    )
    return {"dag": dag, "dag_run": dag_run, "ti": ti, "task": task, "params": {}}
