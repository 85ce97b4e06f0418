"""Encrypted payloads, and a large fan-out split into child workflows."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import date, timedelta

import pytest
from temporalio.client import Client

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.identity import workflow_id
from bridge.temporal.client import data_converter
from bridge.temporal.codec import CodecKeyError, EncryptionCodec, new_key, parse_key
from bridge.temporal.handover import Handover, run_handle
from tests.bridge.conftest import per_customer, running_worker
from tests.bridge.record_history import replay_spec
from tests.bridge.test_dag_run import billing_spec, new_dag

BD = (date.today() - timedelta(days=1)).isoformat()


def test_histories_hold_no_customer_data_in_clear_with_the_codec(
    config: BridgeConfig, lease_store: LeaseStore, sink: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRIDGE_CODEC_KEY", new_key())
    dag_id = new_dag()

    async def scenario() -> tuple[object, bytes]:
        async with running_worker(config, lease_store) as client:
            got = await Handover(client, config.task_queue("default")).start_or_attach(
                billing_spec(dag_id, count=5), BD
            )
            result = await run_handle(client, got.workflow_id).result()
            plain = await Client.connect(config.temporal_address)  # no codec: what is stored
            history = await plain.get_workflow_handle(got.workflow_id).fetch_history()
            return result, b"".join(e.SerializeToString() for e in history.events)

    result, stored = asyncio.run(scenario())
    assert result.status == "success"  # type: ignore[attr-defined]
    assert per_customer(sink) == {f"cust-{n:04d}": 1 for n in range(5)}
    assert b"binary/encrypted" in stored
    assert b"cust-0000" not in stored
    assert b"charge_all" not in stored


def test_codec_refuses_a_payload_from_an_unknown_key() -> None:
    ours = EncryptionCodec(parse_key(new_key()))
    theirs = EncryptionCodec(parse_key(new_key()))

    async def scenario() -> None:
        payloads = await data_converter(theirs).encode(["secret"])
        with pytest.raises(CodecKeyError, match="unknown key"):
            await ours.decode(payloads)

    asyncio.run(scenario())
    with pytest.raises(CodecKeyError, match="32 bytes"):
        parse_key("c2hvcnQ=")


def test_large_fanout_runs_in_child_workflows_and_charges_each_item_once(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    dag_id = new_dag()
    base = replay_spec(dag_id)
    spec = dataclasses.replace(
        base,
        tasks=tuple(
            dataclasses.replace(t, args=(30,)) if t.task_id == "extract" else t for t in base.tasks
        ),
    )

    async def scenario() -> tuple[object, list[str]]:
        async with running_worker(config, lease_store) as client:
            got = await Handover(client, config.task_queue("default")).start_or_attach(
                spec, BD, fanout_threshold=10
            )
            result = await run_handle(client, got.workflow_id).result()
            parent = workflow_id(dag_id, BD)
            children = [w.id async for w in client.list_workflows(f'ParentWorkflowId = "{parent}"')]
            return result, sorted(children)

    result, children = asyncio.run(scenario())
    assert result.status == "success"  # type: ignore[attr-defined]
    assert children == [f"{workflow_id(dag_id, BD)}/charge_each/{n}" for n in range(3)]
    assert result.tasks["tally"].result == 3000  # type: ignore[attr-defined]
    # the whole-list charge and the per-customer charge: each customer once under each key
    assert per_customer(sink) == {f"cust-{n:04d}": 2 for n in range(30)}
    assert len(lease_store.list_leases(prefix=f"{dag_id}/charge_each/", limit=100)) == 30
