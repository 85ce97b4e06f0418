"""A worker SIGKILLed mid-activity: the activity is retried on another worker, each charge once."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.keys import lease_key
from bridge.config import BridgeConfig
from bridge.temporal.client import connect
from bridge.temporal.handover import Handover, run_handle
from tests.bridge.conftest import kill_process, per_customer, start_worker_process, wait_for
from tests.bridge.test_dag_run import BD, billing_spec, new_dag


@pytest.mark.slow
def test_worker_killed_mid_activity_is_retried_elsewhere_and_charges_each_once(
    config: BridgeConfig, lease_store: LeaseStore, sink: str, tmp_path: Path
) -> None:
    dag_id = new_dag()
    spec = billing_spec(dag_id, count=40, delay=0.1)
    first = start_worker_process(config, tmp_path / "worker-a.log")
    second = None
    try:

        async def hand_over() -> str:
            client = await connect(config)
            got = await Handover(client, config.task_queue("default")).start_or_attach(spec, BD)
            return got.workflow_id

        wid = asyncio.run(hand_over())
        wait_for(lambda: len(per_customer(sink)) >= 10, 90, "the first worker to charge 10")
        kill_process(first, signal.SIGKILL)
        charged_by_first = len(per_customer(sink))
        assert charged_by_first < 40, "the kill came too late to be mid-activity"
        second = start_worker_process(config, tmp_path / "worker-b.log")

        async def result() -> object:
            client = await connect(config)
            return await asyncio.wait_for(run_handle(client, wid).result(), 120)

        done = asyncio.run(result())
    finally:
        for proc in (first, second):
            if proc is not None:
                kill_process(proc, signal.SIGTERM)
    assert done.status == "success"  # type: ignore[attr-defined]
    assert per_customer(sink) == {f"cust-{n:04d}": 1 for n in range(40)}
    key = str(lease_key(dag_id, "charge", BD))
    audit = lease_store.history(key)
    granted = [h for h in audit if h["event"] == "acquire" and h["outcome"] == "granted"]
    taken = [h for h in audit if h["event"] == "acquire" and h["outcome"] == "taken_over"]
    assert len(granted) == 1, [(h["event"], h["outcome"]) for h in audit]
    assert len(taken) == 1, [(h["event"], h["outcome"]) for h in audit]
    assert taken[0]["token"] > granted[0]["token"]
    assert taken[0]["holder"]["pid"] == second.pid  # type: ignore[union-attr]
