"""Shadow runs never reach the payment processor: what they would charge is compared instead.

The primary (Airflow's protected run, as the operator runs it) charges at a real local
processor through ``fence.external_call``; the Temporal shadow of the same business run records
what it would have sent. The assertions count the charges at the processor and read the
comparison row. A shadow body that calls the processor around the fence fails loudly.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import psycopg
import pytest
from temporalio.client import WorkflowFailureError

from airflow_plugins.demo.processor import PaymentProcessor
from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.lease.fence import Fence
from airflow_plugins.lease.keys import first_day, lease_key
from bridge.comparison import get_comparison
from bridge.config import BridgeConfig
from bridge.identity import map_items, task_lease_key
from bridge.spec import UPSTREAM_MARKER, DagSpec, RetrySpec, RunMode, TaskSpec
from bridge.temporal.handover import Handover, run_handle
from bridge.worker.egress import ShadowEgressRefused, no_egress
from tests.bridge import workloads
from tests.bridge.conftest import running_worker

W = "tests.bridge.workloads"
COUNT = 12


def spec(dag_id: str, charge: str) -> DagSpec:
    return DagSpec(
        dag_id=dag_id,
        tasks=(
            TaskSpec("extract", callable_ref=f"{W}:customers", args=(COUNT,),
                     side_effect_free=True),
            TaskSpec("charge", upstream=("extract",), callable_ref=f"{W}:{charge}",
                     kwargs={"customers": {UPSTREAM_MARKER: "extract"}}, fenced=True,
                     sink="billing_db", heartbeat_s=5, lease_ttl_s=5,
                     retry=RetrySpec(initial_interval_s=0.2, maximum_attempts=2)),
        ),
    )  # fmt: skip


@pytest.fixture
def processor(sink: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PaymentProcessor]:
    workloads._billing_charges().prepare_sink(sink)
    with PaymentProcessor() as p:
        monkeypatch.setenv("AIRFLOW_CONN_PAYMENT_PROCESSOR", p.url)
        yield p


def primary(store: LeaseStore, sink: str, dag_id: str, bd: str) -> None:
    """Airflow's protected run of the business date (the operator's leases, fence and code)."""
    holder = Holder.airflow(dag_id=dag_id, run_id=f"scheduled__{bd}", task_id="x", try_number=1)
    for task_id in ("extract", "charge"):
        key = str(lease_key(dag_id, task_id, bd))
        lease = store.acquire(key, holder, business_date=first_day(bd)).lease
        result: Any = workloads.customers(COUNT)
        if task_id == "charge":
            fence = Fence(
                key=key, token=lease.token, attempt=lease.attempt, business_date=bd, lease=lease,
                sink_connect=lambda: psycopg.connect(sink, autocommit=True),
            )  # fmt: skip
            fence.advance_sink_fence()
            result = workloads.charge_at_processor(fence, workloads.customers(COUNT))
            fence.close()
        store.complete(lease, result)


async def shadow(config: BridgeConfig, store: LeaseStore, run_spec: DagSpec, bd: str) -> Any:
    async with running_worker(config, store) as client:
        got = await Handover(client, config.task_queue("default")).start_or_attach(
            run_spec, bd, mode=RunMode.SHADOW, compare_poll_s=0.5
        )
        return await asyncio.wait_for(run_handle(client, got.workflow_id).result(), 120)


@pytest.mark.slow
def test_shadow_makes_no_charge_and_the_comparison_shows_what_it_would_charge(
    config: BridgeConfig, lease_store: LeaseStore, sink: str, processor: PaymentProcessor
) -> None:
    dag_id = f"billing_{uuid.uuid4().hex[:8]}"
    bd = (date.today() - timedelta(days=1)).isoformat()
    primary(lease_store, sink, dag_id, bd)
    charged = processor.charges()
    assert len(charged) == COUNT
    result = asyncio.run(shadow(config, lease_store, spec(dag_id, "charge_at_processor"), bd))
    assert result.status == "success"
    assert processor.charges() == charged  # not one charge from the shadow
    row = get_comparison(lease_store, dag_id, bd)
    assert row is not None
    assert row["matched"] is True, row["differences"]
    would = {c["item"]: c for c in row["shadow_calls"]["charge"]}
    sent = {c["item"]: c for c in row["primary_calls"]["charge"]}
    assert sorted(would) == sorted(c["customer"] for c in charged)
    for item, call in would.items():
        assert call["idempotency_key"] == sent[item]["idempotency_key"]
        assert call["params"] == sent[item]["params"]
    at_processor = {c["customer"]: c for c in charged}
    assert {i: c["params"]["amount"] for i, c in would.items()} == {
        i: c["amount"] for i, c in at_processor.items()
    }


def mapped_spec(dag_id: str) -> DagSpec:
    """The charge mapped over the customers: a lease (and a ledger) per customer."""
    return DagSpec(
        dag_id=dag_id,
        tasks=(
            TaskSpec("extract", callable_ref=f"{W}:customers", args=(COUNT,),
                     side_effect_free=True),
            TaskSpec("charge", upstream=("extract",),
                     callable_ref=f"{W}:charge_item_at_processor", fenced=True,
                     sink="billing_db", map_over="extract", heartbeat_s=5, lease_ttl_s=5,
                     retry=RetrySpec(initial_interval_s=0.2, maximum_attempts=2)),
        ),
    )  # fmt: skip


def mapped_primary(store: LeaseStore, sink: str, dag_id: str, bd: str) -> None:
    """Airflow's protected run of the mapped charge: one lease and one call per customer."""
    holder = Holder.airflow(dag_id=dag_id, run_id=f"scheduled__{bd}", task_id="x", try_number=1)
    key = str(lease_key(dag_id, "extract", bd))
    lease = store.acquire(key, holder, business_date=first_day(bd)).lease
    store.complete(lease, workloads.customers(COUNT))
    for map_key, customer in map_items(workloads.customers(COUNT), None):
        key = task_lease_key(dag_id, "charge", bd, map_key, RunMode.PRIMARY)
        lease = store.acquire(key, holder, business_date=first_day(bd)).lease
        fence = Fence(
            key=key, token=lease.token, attempt=lease.attempt, business_date=bd, lease=lease,
            sink_connect=lambda: psycopg.connect(sink, autocommit=True),
        )  # fmt: skip
        fence.advance_sink_fence()
        store.complete(lease, workloads.charge_item_at_processor(fence, customer))
        fence.close()


@pytest.mark.slow
def test_a_mapped_shadow_compares_what_each_item_would_charge(
    config: BridgeConfig, lease_store: LeaseStore, sink: str, processor: PaymentProcessor
) -> None:
    """Each item's would-be call reaches the comparison, as the primary's sent calls do: the
    mapped shadow matches (it once dropped the items' calls and always read as diverging)."""
    dag_id = f"billing_{uuid.uuid4().hex[:8]}"
    bd = (date.today() - timedelta(days=1)).isoformat()
    mapped_primary(lease_store, sink, dag_id, bd)
    charged = processor.charges()
    assert len(charged) == COUNT
    result = asyncio.run(shadow(config, lease_store, mapped_spec(dag_id), bd))
    assert result.status == "success"
    assert processor.charges() == charged  # not one charge from the shadow
    row = get_comparison(lease_store, dag_id, bd)
    assert row is not None
    assert row["matched"] is True, row["differences"]
    would = sorted(c["item"] for c in row["shadow_calls"]["charge"])
    assert would == sorted(c["customer"] for c in charged)


@pytest.mark.slow
def test_a_shadow_calling_the_processor_around_the_fence_fails_loudly(
    config: BridgeConfig, lease_store: LeaseStore, sink: str, processor: PaymentProcessor
) -> None:
    dag_id = f"billing_{uuid.uuid4().hex[:8]}"
    bd = (date.today() - timedelta(days=1)).isoformat()
    primary(lease_store, sink, dag_id, bd)  # the shadow's comparison waits for a primary
    charged = processor.charges()
    started = time.monotonic()
    try:
        result = asyncio.run(
            shadow(config, lease_store, spec(dag_id, "charge_around_the_fence"), bd)
        )
    except WorkflowFailureError as exc:
        failure = repr(exc.cause)
    else:
        assert result.status == "failed"
        failure = str(result.tasks["charge"].error)
    assert "ShadowEgressRefused" in failure or "may not connect" in failure, failure
    assert time.monotonic() - started < 60  # refused at once, not retried
    assert processor.charges() == charged  # the primary's charges, none from the shadow


def test_the_guard_refuses_other_addresses_and_lets_the_allowed_ones_through() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with no_egress([("127.0.0.1", port)]), socket.create_connection(("127.0.0.1", port)):
            pass
        with pytest.raises(ShadowEgressRefused, match="may not connect"), no_egress([]):
            socket.create_connection(("127.0.0.1", port))
        socket.create_connection(("127.0.0.1", port)).close()  # outside the guard: as before


def _swallowing_body() -> None:
    try:
        socket.create_connection(("127.0.0.1", 9))
    except OSError:
        pass  # an SDK turning it into a retryable "connection error", or ignoring it


def test_a_refusal_the_body_swallowed_still_fails_the_block() -> None:
    with pytest.raises(ShadowEgressRefused), no_egress([]):
        _swallowing_body()


def test_the_guard_refuses_starting_a_process_whose_connections_it_cannot_see() -> None:
    with pytest.raises(ShadowEgressRefused, match="may not start a process"), no_egress([]):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # outside the guard: as before


def test_a_refused_process_is_named_by_its_program_never_its_arguments() -> None:
    secret = "PGPASSWORD=hunter2-not-for-logs"
    with pytest.raises(ShadowEgressRefused) as refused, no_egress([]):
        subprocess.run(["/usr/bin/env", secret, "true"], check=True)
    assert "'env'" in str(refused.value)
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ShadowEgressRefused) as refused, no_egress([]):
        os.system(f"{secret} true")
    assert "hunter2" not in str(refused.value)
