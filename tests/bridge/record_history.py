"""Records the DAG-run workflow history that ``test_replay.py`` replays.

Run it when the workflow changes *on purpose* (and version the change), never to make the
replay test pass:

    python -m tests.bridge.record_history   # needs the Temporal server of the test session

It runs a billing run with a mapped fan-out (two child workflows) and a lease held by Airflow
(the durable-timer wait), on a dev server at $BRIDGE_TEMPORAL_ADDR (default 127.0.0.1:27233).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import date, timedelta
from pathlib import Path

from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, Holder, LeaseStore, migrate
from airflow_plugins.lease.keys import lease_key
from bridge.config import BridgeConfig
from bridge.cutover import migrate_bridge
from bridge.spec import UPSTREAM_MARKER, DagSpec, TaskSpec
from bridge.temporal.handover import Handover, run_handle
from tests.bridge.conftest import running_worker
from tests.bridge.test_dag_run import billing_spec
from tests.conftest import create_database, drop_database

HISTORY = Path(__file__).parent / "histories" / "billing_dag_run.json"
W = "tests.bridge.workloads"


def replay_spec(dag_id: str) -> DagSpec:
    """The billing graph plus a mapped per-customer charge (fan-out in child workflows)."""
    base = billing_spec(dag_id, count=6)
    mapped = TaskSpec(
        "charge_each",
        upstream=("extract",),
        callable_ref=f"{W}:charge_mapped",
        map_over="extract",
        map_arg="item",
        fenced=True,
        sink="billing_db",
    )
    tally = TaskSpec(
        "tally",
        upstream=("charge_each",),
        callable_ref=f"{W}:total",
        args=({UPSTREAM_MARKER: "charge_each"},),
        side_effect_free=True,
    )
    return DagSpec(dag_id, (*base.tasks, mapped, tally))


async def record(address: str) -> str:
    """Runs the scenario; returns the history JSON."""
    lease_dsn, sink_dsn = create_database(), create_database("eosink")
    try:
        migrate(lease_dsn, LEASE_STORE)
        migrate_bridge(lease_dsn)
        migrate(sink_dsn, SINK_FENCE)
        import psycopg

        with psycopg.connect(sink_dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE charges (id bigserial PRIMARY KEY, run_key text NOT NULL, "
                "customer text NOT NULL, token bigint, writer text, at timestamptz DEFAULT now())"
            )
        os.environ["AIRFLOW_CONN_BILLING_DB"] = sink_dsn
        config = BridgeConfig(
            temporal_address=address,
            task_queue_prefix=f"rec{uuid.uuid4().hex[:8]}",
            lanes={"default": 8},
            lease_dsn=lease_dsn,
        )
        dag_id = "billing_replay"
        bd = (date.today() - timedelta(days=1)).isoformat()
        with LeaseStore(lease_dsn, ttl=3.0) as store:
            airflow = Holder.airflow(dag_id=dag_id, run_id="r", task_id="charge", try_number=1)
            held = store.acquire(str(lease_key(dag_id, "charge", bd)), airflow, ttl=2.0).lease
            async with running_worker(config, store) as client:
                got = await Handover(client, config.task_queue("default")).start_or_attach(
                    replay_spec(dag_id), bd, fanout_threshold=3
                )
                await asyncio.sleep(1.0)
                store.release(held)
                await run_handle(client, got.workflow_id).result()
                history = await client.get_workflow_handle(got.workflow_id).fetch_history()
                return history.to_json()
    finally:
        drop_database(lease_dsn)
        drop_database(sink_dsn)


def main() -> None:
    """Writes the history file."""
    text = asyncio.run(record(os.environ.get("BRIDGE_TEMPORAL_ADDR", "127.0.0.1:27233")))
    HISTORY.write_text(text)
    print(f"wrote {HISTORY} ({len(text)} bytes)")
    os._exit(0)


if __name__ == "__main__":
    main()
