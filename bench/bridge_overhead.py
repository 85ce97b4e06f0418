"""Handover overhead: raw Temporal client starts vs the bridge's handover call, side by side;
with ``--whole-dag``, a 20-task DAG's makespan in Airflow and through the bridge.

    python bench/bridge_overhead.py [--n 300] [--address 127.0.0.1:27233]
    python bench/bridge_overhead.py --whole-dag [--reps 5] [--slots 8]

For the same trivial workflow, it interleaves ``client.start_workflow(DagRunWorkflow.run, ...)``
with ``Handover.start_or_attach(spec, business_date)`` (key, lease check, size check, start or
attach), each for a new DAG id; latency one call at a time, rate with ``--concurrency`` calls in
flight; no worker runs. Without ``--address`` it starts its own Temporal dev server (offline,
ports 27300-27303) and a lease store database on the local Postgres (``EXACTLY_ONCE_TEST_PG``).
The last line is one JSON object. Targets: handover adds <= 10 ms at p50; rate >= 0.9x raw.

``--whole-dag`` (``bench/whole_dag.py``) also starts an Airflow stack and a bridge worker process,
and runs ``bench/bridge_dag_dags``'s fan-out-and-join DAG in Airflow (LocalExecutor), through the
handover API, and through a ``BridgeOperator`` driver DAG, alternating: median makespans and the
ratios to Airflow's. Target: the bridge no slower than Airflow's own run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from datetime import date, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.client import Client

from airflow_plugins.lease import LEASE_STORE, LeaseStore, migrate
from bridge.cutover import migrate_bridge
from bridge.spec import DagRunInput, DagSpec, TaskSpec
from bridge.temporal.handover import Handover
from bridge.worker.workflows import DagRunWorkflow

BENCH_PORT = 27300


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def measure(address: str, lease_dsn: str, n: int, concurrency: int) -> dict[str, object]:
    """Runs both kinds, interleaved in rounds; returns the figures."""
    client = await Client.connect(address)
    queue = f"bench-{uuid.uuid4().hex[:8]}"  # no worker polls it: starts only
    dag_id = f"bench_{uuid.uuid4().hex[:8]}"
    spec = DagSpec(dag_id, (TaskSpec("noop", callable_ref="builtins:len", args=([],)),))
    today = date.today()
    with LeaseStore(lease_dsn, pool_size=max(4, concurrency)) as store:
        handover = Handover(client, queue, store=store)
        counter = iter(range(1, 10**9))
        lat: dict[str, list[float]] = {"raw": [], "bridge": []}
        busy: dict[str, float] = {"raw": 0.0, "bridge": 0.0}

        async def raw() -> None:
            bd = (today - timedelta(days=next(counter) % 300 + 1)).isoformat()
            start = time.perf_counter()
            await client.start_workflow(
                DagRunWorkflow.run,
                DagRunInput(spec, bd),
                id=f"raw-{uuid.uuid4().hex}",
                task_queue=queue,
            )
            lat["raw"].append(time.perf_counter() - start)

        async def bridge() -> None:
            # a fresh DAG id per call keeps every handover a real start (never an attach)
            own = DagSpec(f"{dag_id}_{next(counter)}", spec.tasks)
            bd = (today - timedelta(days=1)).isoformat()
            start = time.perf_counter()
            await handover.start_or_attach(own, bd)
            lat["bridge"].append(time.perf_counter() - start)

        for kind, call in (("raw", raw), ("bridge", bridge)):  # warm up both paths
            for _ in range(10):
                await call()
            lat[kind].clear()
        rounds = max(1, n // concurrency)
        for r in range(rounds):
            order = [("raw", raw), ("bridge", bridge)]
            if r % 2:
                order.reverse()  # alternate which kind goes first
            for kind, call in order:
                start = time.perf_counter()
                await asyncio.gather(*(call() for _ in range(concurrency)))
                busy[kind] += time.perf_counter() - start
    out: dict[str, object] = {}
    for kind in ("raw", "bridge"):
        ms = [v * 1000 for v in lat[kind]]
        out[kind] = {
            "n": len(ms),
            "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(percentile(ms, 0.99), 2),
            "rate_per_s": round(len(ms) / busy[kind], 1),
        }
    raw_s, bridge_s = out["raw"], out["bridge"]
    assert isinstance(raw_s, dict)
    assert isinstance(bridge_s, dict)
    out["added_p50_ms"] = round(bridge_s["p50_ms"] - raw_s["p50_ms"], 2)
    out["rate_ratio"] = round(bridge_s["rate_per_s"] / raw_s["rate_per_s"], 3)
    return out


def start_server(folder: Path, port: int = BENCH_PORT) -> subprocess.Popen[bytes]:
    """A Temporal dev server for the benchmark (on-disk sqlite, WAL), on ports port..port+3."""
    from tests.bridge.conftest import temporal_binary

    log = (folder / "server.log").open("wb")
    return subprocess.Popen(
        [
            temporal_binary(), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
            "--port", str(port), "--http-port", str(port + 1),
            "--metrics-port", str(port + 2), "--ui-port", str(port + 3),
            "--db-filename", str(folder / "t.db"), "--sqlite-pragma", "journal_mode=wal",
            "--sqlite-pragma", "synchronous=normal", "--log-level", "error",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


async def wait_for_server(address: str, timeout: float = 60.0) -> None:
    """Polls until the server answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await Client.connect(address)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def main() -> None:
    """Runs the benchmark; the last line printed is one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=300, help="starts of each kind")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--address", help="an existing Temporal server")
    parser.add_argument(
        "--temporal-port", type=int, default=BENCH_PORT, help="first of the own server's 4 ports"
    )
    parser.add_argument(
        "--whole-dag", action="store_true", help="the 20-task DAG's makespan, Airflow vs bridge"
    )
    parser.add_argument("--reps", type=int, default=5, help="--whole-dag: timed runs of each")
    parser.add_argument(
        "--slots", type=int, default=8, help="--whole-dag: Airflow's parallelism, the worker's"
    )
    parser.add_argument(
        "--port-base", type=int, default=26200, help="--whole-dag: Airflow's first of 8 ports"
    )
    args = parser.parse_args()
    from tests.conftest import create_database, drop_database

    lease_dsn = create_database("eobench")
    metadata_dsn = create_database("eobench_airflow") if args.whole_dag else None
    server = None
    code = 0
    try:
        migrate(lease_dsn, LEASE_STORE)
        migrate_bridge(lease_dsn)
        address = args.address
        if address is None:
            folder = Path(tempfile.mkdtemp(prefix="bridge-bench-"))
            server = start_server(folder, args.temporal_port)
            address = f"127.0.0.1:{args.temporal_port}"
            asyncio.run(wait_for_server(address))
        if metadata_dsn is not None:
            from whole_dag import measure as whole_dag
            from whole_dag import report

            report(
                whole_dag(
                    address,
                    lease_dsn,
                    metadata_dsn,
                    reps=args.reps,
                    slots=args.slots,
                    port_base=args.port_base,
                )
            )
            return
        # latency one call at a time (what one Airflow try pays), rate with calls in flight
        serial = asyncio.run(measure(address, lease_dsn, args.n, 1))
        loaded = asyncio.run(measure(address, lease_dsn, args.n, args.concurrency))
        for label, figures in (
            ("one at a time", serial),
            (f"{args.concurrency} in flight", loaded),
        ):
            print(f"-- {label}")
            for kind in ("raw", "bridge"):
                f = figures[kind]
                assert isinstance(f, dict)
                print(
                    f"{kind:7s} n={f['n']:5d}  p50={f['p50_ms']:7.2f} ms  "
                    f"p99={f['p99_ms']:7.2f} ms  rate={f['rate_per_s']:7.1f}/s"
                )
        added = serial["added_p50_ms"]
        ratio = loaded["rate_ratio"]
        assert isinstance(added, float)
        assert isinstance(ratio, float)
        print(
            f"handover adds {added} ms at p50 (target <= 10); rate ratio {ratio} with "
            f"{args.concurrency} in flight (target >= 0.9)"
        )
        summary = {
            "raw": serial["raw"],
            "bridge": serial["bridge"],
            "raw_loaded": loaded["raw"],
            "bridge_loaded": loaded["bridge"],
            "added_p50_ms": added,
            "rate_ratio": ratio,
            "targets_met": added <= 10 and ratio >= 0.9,
            "concurrency": args.concurrency,
        }
        print(json.dumps(summary), flush=True)
    except Exception as exc:
        traceback.print_exc()
        print(f"benchmark failed: {exc}", file=sys.stderr)
        code = 1
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=15)
            shutil.rmtree(folder, ignore_errors=True)
        drop_database(lease_dsn)
        if metadata_dsn is not None:
            drop_database(metadata_dsn)
        os._exit(code)


if __name__ == "__main__":
    main()
