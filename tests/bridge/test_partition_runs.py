"""Partitions of one business date are runs of their own on the real Temporal dev server and
Postgres: a workflow, task leases and a run key each, and each task reads its own partition
(``semantics_dags/partition_context.py``'s ``partition_regions``, run through its operator's
execute from the worker's DAG folder)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.in_airflow.translate import translate
from bridge.partition import InvalidPartition
from bridge.spec import DagSpec, TaskSpec
from bridge.temporal.handover import Handover, run_handle
from bridge.worker.catalog import TaskCatalog
from tests.bridge.conftest import running_worker
from tests.bridge.corpus import dag_bag
from tests.bridge.test_corpus_truth import SEMANTICS

BD = "2026-06-14"
REGIONS = ("us", "eu", "apac")


def test_each_region_of_one_business_date_runs_once_under_its_own_keys(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    catalog = TaskCatalog(str(SEMANTICS))
    catalog.load()
    spec = translate(dag_bag(SEMANTICS)["partition_regions"]).spec
    assert spec is not None
    catalog_id = spec.dag_id  # the worker finds the task in its DAG folder by this id

    async def scenario() -> tuple[list[str], list[object], bool]:
        async with running_worker(config, lease_store, catalog) as client:
            handover = Handover(client, config.task_queue("default"), store=lease_store)
            got = [
                await handover.start_or_attach(spec, BD, partition_key=region) for region in REGIONS
            ]
            results = [await run_handle(client, g.workflow_id).result() for g in got]
            again = await handover.start_or_attach(spec, BD, partition_key="eu")
            return [g.workflow_id for g in got], results, again.started

    ids, results, started_again = asyncio.run(scenario())
    assert ids == [f"dagrun:{catalog_id}/dagrun/{BD}@{r}" for r in REGIONS]
    # each run's task read its own partition (a runtime partition has no date)
    assert [r.tasks["region"].result for r in results] == [f"{r} None" for r in REGIONS]  # type: ignore[attr-defined]
    assert started_again is False  # the eu run of that day is done: nothing started twice
    for region in REGIONS:
        task = lease_store.get(f"{catalog_id}/region/{BD}@{region}")
        assert task is not None
        assert task["state"] == "succeeded"
        run = lease_store.get(f"{catalog_id}/dagrun/{BD}@{region}")
        assert run is not None
        assert run["state"] == "succeeded"
    assert lease_store.get(f"{catalog_id}/region/{BD}") is None  # no unpartitioned key taken


def test_a_partition_key_for_a_dag_that_is_not_partitioned_starts_nothing(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    spec = DagSpec(
        f"plain_{uuid.uuid4().hex[:6]}", (TaskSpec("t", callable_ref="builtins:len", args=([],)),)
    )

    async def scenario() -> int:
        async with running_worker(config, lease_store) as client:
            with pytest.raises(InvalidPartition, match="is not a partitioned DAG"):
                await Handover(client, config.task_queue("default")).start_or_attach(
                    spec, BD, partition_key="us"
                )
            query = f'WorkflowId = "dagrun:{spec.dag_id}/dagrun/{BD}@us"'
            return len([w async for w in client.list_workflows(query)])

    assert asyncio.run(scenario()) == 0


def test_the_airflow_side_handover_carries_the_partition_through_the_cli_child(
    config: BridgeConfig, lease_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_plugins.lease import InvalidLeaseInput
    from bridge.in_airflow import handoff
    from tests.bridge.conftest import REPO

    catalog = TaskCatalog(str(SEMANTICS))
    catalog.load()
    spec = translate(dag_bag(SEMANTICS)["partition_regions"]).spec
    assert spec is not None
    for name, value in {
        "BRIDGE_TEMPORAL_ADDR": config.temporal_address,
        "BRIDGE_QUEUE_PREFIX": config.task_queue_prefix,
        "BRIDGE_LANES": "default:8",
        "BRIDGE_LEASE_DSN": config.lease_dsn or "",
        "PYTHONPATH": str(REPO),
    }.items():
        monkeypatch.setenv(name, value)
    day = "2026-06-15"

    async def scenario() -> object:
        async with running_worker(config, lease_store, catalog) as client:
            # the child process the Airflow operator and router start (bridge.cli handover)
            reply = await asyncio.to_thread(handoff.request, spec, day, partition=("apac", None))
            assert reply is not None
            assert reply.workflow_id == f"dagrun:{spec.dag_id}/dagrun/{day}@apac"
            return await run_handle(client, reply.workflow_id).result()

    result = asyncio.run(scenario())
    assert result.tasks["region"].result == "apac None"  # type: ignore[attr-defined]
    # a partition for a DAG that has none: refused by the child, nothing started
    plain = DagSpec("plain_dag", (TaskSpec("t", callable_ref="builtins:len", args=([],)),))
    with pytest.raises(InvalidLeaseInput, match="is not a partitioned DAG"):
        handoff.request(plain, day, partition=("us", None))
    assert lease_store.list_leases(prefix="plain_dag") == []
