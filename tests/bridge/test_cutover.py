"""Cutover modes: stored, audited, fixed per run; a billing DAG through every mode and back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from datetime import UTC, date, datetime, timedelta

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from airflow_plugins.lease import LeaseStore
from bridge.comparison import ready
from bridge.config import BridgeConfig
from bridge.cutover import CutoverMode, ModeChangeRefused, ModeStore, UnknownMode, audit_key
from bridge.identity import workflow_id
from bridge.spec import DagSpec, RunMode
from bridge.temporal.handover import Handover, run_handle
from bridge.temporal.schedule import create_schedule, delete_schedule, schedule_id
from tests.bridge.conftest import REPO, charges, per_customer, running_worker, wait_for
from tests.bridge.test_dag_run import billing_spec, new_dag
from tests.bridge.test_shadow import airflow_primary


def test_mode_changes_follow_the_path_are_audited_and_fixed_per_run(
    lease_store: LeaseStore,
) -> None:
    modes = ModeStore(lease_store)
    dag_id = new_dag()
    assert modes.get(dag_id) is CutoverMode.AIRFLOW
    assert modes.fix_for_run(dag_id, "run-1") is CutoverMode.AIRFLOW
    with pytest.raises(ModeChangeRefused, match="skips a step"):
        modes.set(dag_id, "temporal", actor="ops", reason="too fast")
    modes.set(dag_id, "shadow", actor="ops", reason="start dual run")
    # run-1 started in airflow mode: it stays there; a new run gets the new mode
    assert modes.fix_for_run(dag_id, "run-1") is CutoverMode.AIRFLOW
    assert modes.fix_for_run(dag_id, "run-2") is CutoverMode.SHADOW
    with pytest.raises(ModeChangeRefused, match="not ready"):
        modes.set(dag_id, "temporal", actor="ops", reason="cut over", ready=False)
    modes.set(dag_id, "temporal", actor="ops", reason="5 matching runs", ready=True)
    modes.set(dag_id, "temporal-scheduled", actor="ops", reason="schedule in temporal")
    modes.set(dag_id, "shadow", actor="ops", reason="rollback two steps")
    change = modes.set(dag_id, "airflow", actor="ops", reason="rollback")
    assert (change.previous, change.current, change.version) == (
        CutoverMode.SHADOW, CutoverMode.AIRFLOW, 5,
    )  # fmt: skip
    with pytest.raises(UnknownMode, match="use one of airflow, shadow, temporal"):
        modes.set(dag_id, "temporall", actor="ops", reason="typo")
    with pytest.raises(ModeChangeRefused, match="actor and a reason"):
        modes.set(dag_id, "shadow", actor="", reason="")
    audit = [
        (row["input"]["from"], row["output"]["to"], row["actor"])
        for row in lease_store.history(audit_key(dag_id))
    ]
    assert audit == [
        ("airflow", "shadow", "ops"),
        ("shadow", "temporal", "ops"),
        ("temporal", "temporal-scheduled", "ops"),
        ("temporal-scheduled", "shadow", "ops"),
        ("shadow", "airflow", "ops"),
    ]


def test_cli_refuses_an_unknown_mode_with_a_clear_error(bridge_db: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "mode", "set", "billing_x", "temporary",
         "--actor", "ops", "--reason", "typo"],
        cwd=REPO, env={"BRIDGE_LEASE_DSN": bridge_db, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "unknown cutover mode 'temporary'" in done.stderr
    got = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "mode", "get", "billing_x"],
        cwd=REPO, env={"BRIDGE_LEASE_DSN": bridge_db, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert got.returncode == 0
    assert got.stdout.strip() == "airflow"


class Journey:
    """Runs business dates the way the system would in the DAG's mode at each run's start."""

    def __init__(self, client: Client, config: BridgeConfig, store: LeaseStore, sink: str,
                 spec: DagSpec) -> None:  # fmt: skip
        self.client, self.store, self.sink, self.spec = client, store, sink, spec
        self.handover = Handover(client, config.task_queue("default"), store=store)
        self.modes = ModeStore(store)
        self.charged: list[str] = []

    async def run(self, bd: str) -> None:
        """One business run: Airflow, Airflow plus a shadow, or a Temporal handover."""
        dag_id = self.spec.dag_id
        mode = self.modes.fix_for_run(dag_id, f"scheduled__{bd}")
        if mode in (CutoverMode.AIRFLOW, CutoverMode.SHADOW):
            airflow_primary(self.store, self.sink, dag_id, bd, 8)
        if mode is not CutoverMode.AIRFLOW:
            got = await self.handover.start_or_attach(
                self.spec, bd, mode=RunMode((mode is CutoverMode.SHADOW and "shadow") or "primary"),
                compare_poll_s=0.5,
            )  # fmt: skip
            await run_handle(self.client, got.workflow_id).result()
        self.charged.append(bd)

    async def scheduled_tick(self, queue: str) -> str:
        """Creates the Temporal schedule, fires one tick, waits for its run; returns its date."""
        await create_schedule(self.client, self.spec, queue)
        await self.client.get_schedule_handle(schedule_id(self.spec.dag_id)).trigger()
        scheduled = datetime.now(UTC).date().isoformat()  # the tick's nominal time is now
        wid = workflow_id(self.spec.dag_id, scheduled)
        deadline = asyncio.get_running_loop().time() + 120
        while True:
            try:
                await run_handle(self.client, wid).result()
                break
            except RPCError:  # the child is not started yet
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self.charged.append(scheduled)
        return scheduled


@pytest.mark.slow
def test_billing_dag_through_every_mode_and_back_charges_each_date_exactly_once(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    dag_id = new_dag()
    spec = DagSpec(**{**billing_spec(dag_id, count=8).__dict__, "schedule": "0 2 * * *"})
    modes = ModeStore(lease_store)
    today = datetime.now(UTC).date()
    days = iter(today - timedelta(days=n) for n in range(1, 100))

    def next_date() -> str:
        return next(days).isoformat()

    async def journey() -> list[str]:
        async with running_worker(config, lease_store) as client:
            trip = Journey(client, config, lease_store, sink, spec)
            for bd in (next_date(), next_date()):
                await trip.run(bd)
            modes.set(dag_id, "shadow", actor="ops", reason="dual run")
            for bd in (next_date(), next_date()):
                await trip.run(bd)
            is_ready = ready(lease_store, dag_id, 2)
            modes.set(dag_id, "temporal", actor="ops", reason="ready", ready=is_ready)
            for bd in (next_date(), trip.charged[0]):  # a new date, and a re-run of an old one
                await trip.run(bd)
            modes.set(dag_id, "temporal-scheduled", actor="ops", reason="schedule")
            scheduled = await trip.scheduled_tick(config.task_queue("default"))
            # rollback, step by step, each running a date; then a re-run of the scheduled date
            modes.set(dag_id, "temporal", actor="ops", reason="rollback")
            await delete_schedule(client, dag_id)
            await trip.run(next_date())
            modes.set(dag_id, "shadow", actor="ops", reason="rollback")
            await trip.run(next_date())
            modes.set(dag_id, "airflow", actor="ops", reason="rollback")
            for bd in (next_date(), scheduled):
                await trip.run(bd)
            return trip.charged

    dates = sorted(set(asyncio.run(journey())))
    rows = charges(sink)
    assert len(dates) == 9  # 8 past dates and today (the scheduled tick)
    assert {r[0] for r in rows} == {f"{dag_id}/charge/{bd}" for bd in dates}
    for bd in dates:
        customers = sorted(r[1] for r in rows if r[0] == f"{dag_id}/charge/{bd}")
        assert customers == [f"cust-{n:04d}" for n in range(8)], bd
    assert len(rows) == 8 * len(dates)  # exactly once: no date, no customer twice


@pytest.mark.slow
def test_both_engines_primary_by_mistake_still_write_each_item_once(
    config: BridgeConfig, lease_store: LeaseStore, sink: str
) -> None:
    dag_id = new_dag()
    spec = billing_spec(dag_id, count=30, delay=0.05)
    bd = (date.today() - timedelta(days=1)).isoformat()
    airflow_outcomes: list[str] = []

    async def both() -> object:
        async with running_worker(config, lease_store) as client:
            got = await Handover(client, config.task_queue("default")).start_or_attach(spec, bd)
            airflow = threading.Thread(
                target=lambda: airflow_outcomes.extend(
                    airflow_primary(lease_store, sink, dag_id, bd, 30, delay=0.05)
                )
            )
            airflow.start()
            result = await run_handle(client, got.workflow_id).result()
            await asyncio.to_thread(airflow.join, 120)
            return result

    result = asyncio.run(both())
    assert result.status == "success"  # type: ignore[attr-defined]
    wait_for(lambda: len(airflow_outcomes) == 4, 60, "the Airflow side to finish")
    assert per_customer(sink) == {f"cust-{n:04d}": 1 for n in range(30)}
    # one engine charged, the other found the key held, then succeeded, and did not charge
    charge_outcome = airflow_outcomes[2]
    assert charge_outcome in ("granted", "succeeded")
    writers = {r[2] for r in charges(sink)}
    assert len(writers) == 1, "one token wrote every charge"
