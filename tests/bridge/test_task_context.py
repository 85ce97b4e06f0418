"""Airflow's task context carried into the worker: ``task_state_store`` across tries,
``asset_state_store`` across runs and DAGs (a shadow keeping its own), ``async def`` callables
awaited, ``test_mode`` left at its default (None, as Airflow's task runner leaves it); on the
real Temporal dev server and Postgres, with the DAGs translated from a folder and their tasks
rebuilt from it as the worker rebuilds them.
"""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.in_airflow.translate import translate
from bridge.spec import DagRunInput, DagRunResult, RunMode, TaskKind
from bridge.worker.catalog import TaskCatalog
from bridge.worker.workflows import DagRunWorkflow
from tests.bridge.conftest import running_worker
from tests.bridge.corpus import dag_bag


def _day(n: int) -> str:
    return (date.today() - timedelta(days=10 - n)).isoformat()


DAGS = """
import asyncio
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, task

COUNTER = Asset(name="{asset}", uri="s3://bridge-tests/{asset}")
START = pendulum.datetime(2024, 1, 1, tz="UTC")

with DAG("{p}_resume", schedule=None, start_date=START, catchup=False):

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def resume(task_state_store=None, ti=None):
        seen = task_state_store.get("submitted")
        if seen is None:
            task_state_store.set("submitted", f"try-{{ti.try_number}}")
            raise RuntimeError("lost the worker after submitting")
        return {{"seen": seen, "try": ti.try_number}}

    resume()

# a shadow runs a task tagged side-effect-free (its state store writes are its own)
with DAG("{p}_advance", schedule=None, start_date=START, catchup=False,
         tags=["side-effect-free:advance"]):

    @task(inlets=[COUNTER], outlets=[COUNTER])
    def advance(asset_state_store=None):
        state = asset_state_store[COUNTER]
        count = state.get("count", default=0) + 1
        state.set("count", count)
        return count

    advance()

with DAG("{p}_read", schedule=None, start_date=START, catchup=False,
         tags=["side-effect-free:read"]):

    @task(inlets=[COUNTER])
    def read(asset_state_store=None):
        return asset_state_store.get("count")

    read()

with DAG("{p}_async", schedule=None, start_date=START, catchup=False):

    @task
    async def gather_pages(test_mode=None):
        async def page(n):
            await asyncio.sleep(0.05)
            return n * 100

        rows = await asyncio.gather(*(page(n) for n in range(1, 4)))
        return {{"rows": sum(rows), "test_mode": test_mode}}

    gather_pages()

with DAG("{p}_mapped_async", schedule=None, start_date=START, catchup=False):

    @task
    def pages():
        return [1, 2, 3]

    @task
    async def fetch(page):
        await asyncio.sleep(0.05)
        return page * 100

    fetch.expand(page=pages())

with DAG("{p}_mapped_state", schedule=None, start_date=START, catchup=False):

    @task
    def tables():
        return ["orders", "customers", "products"]

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def process(table, task_state_store=None, ti=None):
        if table == "customers" and ti.try_number == 1:
            task_state_store.set("half_done", table)
            raise RuntimeError("lost the worker half way")
        return {{"map_index": ti.map_index, "half_done": task_state_store.get("half_done")}}

    process.expand(table=tables())
"""


@pytest.fixture
def dags(tmp_path: Path) -> tuple[str, dict[str, Any], TaskCatalog]:
    """This test's DAGs (a prefix of their own, an asset of their own) and their catalog."""
    prefix = f"ctx_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "context_dags.py").write_text(
        textwrap.dedent(DAGS.format(p=prefix, asset=f"{prefix}/counter"))
    )
    catalog = TaskCatalog(str(folder))
    catalog.load()  # on the main thread: Airflow's parser uses SIGALRM
    return prefix, dag_bag(folder), catalog


async def _run(client: Any, config: BridgeConfig, dag: Any, day: str, mode: RunMode) -> Any:
    spec = translate(dag).spec
    assert spec is not None, translate(dag)
    handle = await client.start_workflow(
        DagRunWorkflow.run,
        DagRunInput(spec, day, mode=mode, compare_poll_s=0.2, compare_wait_s=0.5),
        id=f"{dag.dag_id}/{mode.value}/{day}/{uuid.uuid4().hex[:6]}",
        task_queue=config.task_queue(spec.lane),
    )
    return await handle.result()


def _outcome(result: DagRunResult, task_id: str) -> tuple[str, Any]:
    got = result.tasks[task_id]
    return got.status, got.result


def test_the_context_callables_translate_and_run_through_their_operator(
    dags: tuple[str, dict[str, Any], TaskCatalog],
) -> None:
    prefix, bag, _ = dags
    for name in ("resume", "advance", "read", "async"):
        spec = translate(bag[f"{prefix}_{name}"]).spec
        assert spec is not None, name
        assert [t.kind for t in spec.tasks] == [TaskKind.EXECUTE], name


def test_a_retry_reads_the_task_state_its_first_try_wrote(
    config: BridgeConfig,
    lease_store: LeaseStore,
    dags: tuple[str, dict[str, Any], TaskCatalog],
) -> None:
    prefix, bag, catalog = dags

    async def scenario() -> DagRunResult:
        async with running_worker(config, lease_store, catalog) as client:
            return await _run(client, config, bag[f"{prefix}_resume"], _day(1), RunMode.PRIMARY)

    result = asyncio.run(scenario())
    assert result.status == "success"
    assert _outcome(result, "resume") == ("succeeded", {"seen": "try-1", "try": 2})


def test_asset_state_lasts_across_runs_and_dags_and_a_shadow_keeps_its_own(
    config: BridgeConfig,
    lease_store: LeaseStore,
    dags: tuple[str, dict[str, Any], TaskCatalog],
) -> None:
    prefix, bag, catalog = dags
    advance, read = bag[f"{prefix}_advance"], bag[f"{prefix}_read"]

    async def scenario() -> list[tuple[str, Any]]:
        async with running_worker(config, lease_store, catalog) as client:
            runs = [
                (advance, _day(1), RunMode.PRIMARY),
                (advance, _day(2), RunMode.PRIMARY),
                (read, _day(2), RunMode.PRIMARY),
                (advance, _day(3), RunMode.SHADOW),
                (read, _day(3), RunMode.SHADOW),
                (read, _day(4), RunMode.PRIMARY),
            ]
            seen = []
            for dag, day, mode in runs:
                result = await _run(client, config, dag, day, mode)
                seen.append(_outcome(result, next(iter(result.tasks))))
            return seen

    seen = asyncio.run(scenario())
    # run 2 reads run 1's count; another DAG reads it; the shadow starts from its own (none)
    # and the primary never sees the shadow's write
    assert [value for _, value in seen] == [1, 2, 2, 1, 1, 2]
    assert {status for status, _ in seen} == {"succeeded"}
    with lease_store.connection() as conn:
        rows = conn.execute(
            "SELECT mode, key, value, updated_by_dag_id FROM bridge.asset_state "
            "WHERE asset = %(asset)s ORDER BY mode",
            {"asset": f"{prefix}/counter"},
        ).fetchall()
    assert [tuple(r.values()) for r in rows] == [
        ("primary", "count", 2, f"{prefix}_advance"),
        ("shadow", "count", 1, f"{prefix}_advance"),
    ]


def test_an_async_callable_is_awaited_and_test_mode_keeps_its_default(
    config: BridgeConfig,
    lease_store: LeaseStore,
    dags: tuple[str, dict[str, Any], TaskCatalog],
) -> None:
    prefix, bag, catalog = dags

    async def scenario() -> DagRunResult:
        async with running_worker(config, lease_store, catalog) as client:
            return await _run(client, config, bag[f"{prefix}_async"], _day(1), RunMode.PRIMARY)

    result = asyncio.run(scenario())
    assert _outcome(result, "gather_pages") == ("succeeded", {"rows": 600, "test_mode": None})


def test_a_mapped_async_callable_is_awaited_per_item(
    config: BridgeConfig,
    lease_store: LeaseStore,
    dags: tuple[str, dict[str, Any], TaskCatalog],
) -> None:
    prefix, bag, catalog = dags
    spec = translate(bag[f"{prefix}_mapped_async"]).spec
    assert spec is not None
    assert spec.task("fetch").kind is TaskKind.PYTHON  # called with its arguments, per item

    async def scenario() -> DagRunResult:
        async with running_worker(config, lease_store, catalog) as client:
            return await _run(
                client, config, bag[f"{prefix}_mapped_async"], _day(1), RunMode.PRIMARY
            )

    result = asyncio.run(scenario())
    assert result.status == "success"
    # handed on as Airflow does: the items' results in map index order
    assert _outcome(result, "fetch") == ("succeeded", [100, 200, 300])
    assert result.tasks["fetch"].items == {"1": 100, "2": 200, "3": 300}


def test_a_mapped_callable_gets_its_items_map_index_and_task_state(
    config: BridgeConfig,
    lease_store: LeaseStore,
    dags: tuple[str, dict[str, Any], TaskCatalog],
) -> None:
    prefix, bag, catalog = dags
    spec = translate(bag[f"{prefix}_mapped_state"]).spec
    assert spec is not None
    assert spec.task("process").context_args == ("task_state_store", "ti")

    async def scenario() -> DagRunResult:
        async with running_worker(config, lease_store, catalog) as client:
            return await _run(
                client, config, bag[f"{prefix}_mapped_state"], _day(1), RunMode.PRIMARY
            )

    result = asyncio.run(scenario())
    # each item has its own state (as Airflow's per map_index), kept across its tries
    assert _outcome(result, "process") == (
        "succeeded",
        [
            {"map_index": 0, "half_done": None},
            {"map_index": 1, "half_done": "customers"},
            {"map_index": 2, "half_done": None},
        ],
    )
    # the per-item record, by item (a payload's dict keys come back sorted: no order here)
    assert set(result.tasks["process"].items) == {"orders", "customers", "products"}
