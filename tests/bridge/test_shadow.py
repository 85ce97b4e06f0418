"""Shadow mode: Temporal runs the same business run under shadow leases, captures its sink
writes and rolls them back; the comparison row says whether it matched Airflow's run."""

from __future__ import annotations

import asyncio
import time
from datetime import date, timedelta

import psycopg
import pytest

from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.lease.fence import Fence
from airflow_plugins.lease.keys import first_day, lease_key
from bridge.comparison import get_comparison, ready
from bridge.config import BridgeConfig
from bridge.spec import RunMode, TaskSpec
from bridge.temporal.handover import Handover, HandoverRefused, run_handle
from tests.bridge import workloads
from tests.bridge.conftest import charges, running_worker
from tests.bridge.test_dag_run import billing_spec, new_dag


def airflow_primary(
    store: LeaseStore, sink: str, dag_id: str, bd: str, count: int, delay: float = 0.0
) -> list[str]:
    """Airflow's protected run of the same business date, as ExactlyOnceOperator runs it: the
    same leases, the same ``Fence`` and the same task code (without the Airflow scheduler).
    A held lease is waited for; a succeeded one is not run again. Returns the outcomes."""
    holder = Holder.airflow(dag_id=dag_id, run_id=f"scheduled__{bd}", task_id="x", try_number=1)
    outcomes = []
    for task_id in ("extract", "audit", "charge", "report"):
        key = str(lease_key(dag_id, task_id, bd))
        deadline = time.monotonic() + 120
        got = store.acquire(key, holder, business_date=first_day(bd))
        while got.outcome == "held" and time.monotonic() < deadline:
            time.sleep(0.2)
            got = store.acquire(key, holder, business_date=first_day(bd))
        outcomes.append(str(got.outcome))
        if not got.granted:
            continue
        lease = got.lease
        if task_id != "charge":
            result: object = {
                "extract": workloads.customers(count),
                "audit": 2,
                "report": {"charge": {"charged": count, "cents": 100 * count}},
            }[task_id]
        else:
            fence = Fence(
                key=key, token=lease.token, attempt=lease.attempt, business_date=bd, lease=lease,
                sink_connect=lambda: psycopg.connect(sink, autocommit=True),
            )  # fmt: skip
            fence.advance_sink_fence()
            result = workloads.charge_all(fence, workloads.customers(count), delay=delay)
            fence.close()
        store.complete(lease, result)
    return outcomes


def sink_state(dsn: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as conn:
        return (
            conn.execute("SELECT count(*) FROM charges").fetchone()[0],  # type: ignore[index]
            conn.execute("SELECT count(*) FROM runfence.fence").fetchone()[0],  # type: ignore[index]
            conn.execute("SELECT count(*) FROM runfence.ledger").fetchone()[0],  # type: ignore[index]
        )


def with_cents(spec, cents: int):  # type: ignore[no-untyped-def]
    tasks = tuple(
        TaskSpec(**{**t.__dict__, "kwargs": {**t.kwargs, "cents": cents}})
        if t.task_id == "charge"
        else t
        for t in spec.tasks
    )
    return type(spec)(**{**spec.__dict__, "tasks": tasks})


@pytest.mark.slow
def test_shadow_leaves_the_sink_unchanged_and_compares_matching_and_diverging_runs(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    dag_id = new_dag()
    spec = billing_spec(dag_id, count=12)
    day1 = (date.today() - timedelta(days=3)).isoformat()
    day2 = (date.today() - timedelta(days=2)).isoformat()
    day3 = (date.today() - timedelta(days=1)).isoformat()

    async def shadow(run_spec, bd: str, primary_later: bool = False):  # type: ignore[no-untyped-def]
        async with running_worker(config, lease_store) as client:
            got = await Handover(client, config.task_queue("default")).start_or_attach(
                run_spec, bd, mode=RunMode.SHADOW, compare_poll_s=0.5
            )
            if primary_later:
                await asyncio.sleep(1.5)  # the shadow finished first and waits for Airflow
                airflow_primary(lease_store, sink, dag_id, bd, 12)
            return await asyncio.wait_for(run_handle(client, got.workflow_id).result(), 120)

    # a matching run: Airflow first, then the shadow
    airflow_primary(lease_store, sink, dag_id, day1, 12)
    before = sink_state(sink)
    result = asyncio.run(shadow(spec, day1))
    assert sink_state(sink) == before, "the shadow run changed the sink"
    assert result.status == "success"
    row = get_comparison(lease_store, dag_id, day1)
    assert row is not None
    assert row["matched"] is True, row["differences"]
    assert row["primary_status"] == row["shadow_status"] == "success"
    assert row["primary_items"]["charge"] == row["shadow_items"]["charge"]
    assert len(row["shadow_items"]["charge"]) == 12
    captured = row["shadow_rows"]["charge"]["public.charges"]
    assert sorted(r["customer"] for r in captured) == workloads.customers(12)

    # a second matching run, the shadow finishing before Airflow: it waits, then compares
    result = asyncio.run(shadow(spec, day2, primary_later=True))
    assert get_comparison(lease_store, dag_id, day2)["matched"] is True  # type: ignore[index]
    assert ready(lease_store, dag_id, 2)

    # a diverging run: the Temporal version charges 150 cents where Airflow charged 100
    airflow_primary(lease_store, sink, dag_id, day3, 12)
    before = sink_state(sink)
    asyncio.run(shadow(with_cents(spec, 150), day3))
    assert sink_state(sink) == before
    row = get_comparison(lease_store, dag_id, day3)
    assert row is not None
    assert row["matched"] is False
    diffs = {(d["what"], d.get("task")) for d in row["differences"]}
    assert ("output", "charge") in diffs
    assert ("output", "report") in diffs
    assert all(
        r["writer"] == "temporal:150" for r in row["shadow_rows"]["charge"]["public.charges"]
    )
    assert not ready(lease_store, dag_id, 2)
    # every real charge is Airflow's, once per customer and day
    assert len(charges(sink)) == 36
    assert len(set(charges(sink))) == 36


def test_shadow_refuses_tasks_with_effects_outside_a_fence_by_name(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    dag_id = new_dag()
    spec = billing_spec(dag_id)
    unsafe = TaskSpec("send_email", upstream=("charge",), callable_ref="builtins:print")
    spec = type(spec)(**{**spec.__dict__, "tasks": (*spec.tasks, unsafe)})

    async def scenario() -> None:
        async with running_worker(config, lease_store) as client:
            await Handover(client, config.task_queue("default")).start_or_attach(
                spec, "2026-01-01", mode=RunMode.SHADOW
            )

    with pytest.raises(HandoverRefused, match="send_email: writes outside a fence"):
        asyncio.run(scenario())
