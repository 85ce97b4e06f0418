"""What the fence adds to each external call: fenced vs bare SDK calls to the same processor.

    .venv/bin/python bench/external_call.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
                                            [--items 200] [--rounds 3] [--latency-ms 0]
                                            [--one-key]

It starts the stand-in payment processor on 127.0.0.1 (in its own process, so its CPU is not
counted in ours), makes a lease store and a sink in new databases of the server (dropped at the
end), and charges ``--items`` customers each way, the two ways side by side in each round:

* ``bare``: the stripe SDK's PaymentIntent create with an idempotency key, nothing else;
* ``fenced``: ``ExternalCalls.call`` under a held lease: the intended claim (one fenced
  statement: the token check and the ledger claim), the same SDK call with the fence's headers,
  the answer's record (one fenced statement).

First one call at a time, the ways interleaved item by item (latency per item: p50 / p99, and
the p50 the fence adds); then 8 calls in flight, in short slices taking turns (8 threads, each
with its own sink connection, lease key and SDK client, so no in-flight call waits for another's
connection or fence row; throughput, and the fenced over the bare ratio; ``--one-key``: the 8
share one lease, as one run's items in flight together, their connections still their own, so
their fenced statements take the key's one fence row in turn), and ``many``: one body's
``ExternalCalls.call_many`` with 8 in flight on one lease, one connection and one client (the
claims of the items waiting for a slot, and the records of the answers that came back
together, one fenced statement each). ``--latency-ms``
makes each charge take that long at the processor (a real one answers in hundreds of
milliseconds); at 0 the processor answers at once and the run is bound by the cores it shares
with the client and Postgres. The last line of stdout is one JSON object with the figures (and
the machine's load average before and after: other work on the same cores shows there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dags"))
import billing_charges

from airflow_plugins.demo.deployment import create_database, drop_database
from airflow_plugins.demo.processor import ProcessorProcess
from airflow_plugins.lease import (
    LEASE_STORE,
    SINK_FENCE,
    Holder,
    Lease,
    LeaseStore,
    migrate,
)
from airflow_plugins.lease.external_call import ExternalCalls, OutgoingCall

IN_FLIGHT = 8
COMMIT_SQL = (
    "INSERT INTO bench_commit (k, n) VALUES (%(k)s, 1) "
    "ON CONFLICT (k) DO UPDATE SET n = bench_commit.n + 1"
)
SLICES = 5  # in-flight slices per round, the two ways in turn
DAY = "2024-02-15"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Ways:
    """The two ways of making one item's call, for one worker (its own client and connection)."""

    def __init__(
        self, url: str, store: LeaseStore, sink: str, worker: int, shared: Lease | None = None
    ) -> None:
        self.client = billing_charges.stripe_client(url)
        self.send = billing_charges.stripe_sender(self.client)
        self.conn = psycopg.connect(sink, autocommit=True)
        lease = shared
        if lease is None:
            key = f"bench_billing/charge/{DAY}-{uuid.uuid4().hex[:8]}-{worker}"
            lease = store.acquire(key, Holder.process(f"bench-{worker}"), ttl=600).lease
        self.calls = ExternalCalls(lambda: self.conn, lease.key, lease.token)
        self.prefix = uuid.uuid4().hex[:8]

    def bare(self, i: int) -> None:
        item = f"{self.prefix}-bare-{i}"
        params = billing_charges.charge_params(DAY, item)
        self.send(OutgoingCall("bench", item, 1, uuid.uuid4().hex, params))

    def fenced(self, i: int) -> None:
        item = f"{self.prefix}-fenced-{i}"
        self.calls.call(item, billing_charges.charge_params(DAY, item), self.send)

    def commit(self, i: int) -> None:
        """One durable single-row write on the sink connection: the floor under each of the
        fenced call's two steps (each is one such commit)."""
        self.conn.execute(COMMIT_SQL, {"k": i % 64})

    def close(self) -> None:
        self.conn.close()


def one_at_a_time(ways: Ways, items: int, offset: int) -> dict[str, list[float]]:
    """Milliseconds per call, one call at a time, the two ways interleaved item by item (in
    turn first), so a busy moment of the machine falls on both alike."""
    took: dict[str, list[float]] = {"bare": [], "fenced": [], "commit": []}
    for i in range(items):
        for name in ("bare", "fenced", "commit") if i % 2 == 0 else ("commit", "fenced", "bare"):
            way: Callable[[int], None] = getattr(ways, name)
            start = time.perf_counter()
            way(offset + i)
            took[name].append((time.perf_counter() - start) * 1000)
    return took


class Many:
    """One body charging its items with ``call_many``, ``IN_FLIGHT`` at the processor at once."""

    def __init__(self, url: str, store: LeaseStore, sink: str) -> None:
        self.send = billing_charges.stripe_sender(billing_charges.stripe_client(url))
        self.conn = psycopg.connect(sink, autocommit=True)
        key = f"bench_billing/charge/{DAY}-{uuid.uuid4().hex[:8]}-many"
        lease = store.acquire(key, Holder.process("bench-many"), ttl=600).lease
        self.calls = ExternalCalls(lambda: self.conn, lease.key, lease.token)
        self.prefix = uuid.uuid4().hex[:8]

    def run(self, items: int, offset: int) -> tuple[int, float]:
        """Calls made and seconds taken for ``items`` new items."""
        batch = [f"{self.prefix}-many-{offset + i}" for i in range(items)]
        start = time.perf_counter()
        self.calls.call_many(
            [(item, billing_charges.charge_params(DAY, item)) for item in batch],
            self.send,
            in_flight=IN_FLIGHT,
        )
        return items, time.perf_counter() - start

    def close(self) -> None:
        self.conn.close()


def in_flight(workers: list[Ways], name: str, items: int, offset: int) -> tuple[int, float]:
    """Calls made and seconds taken with one call in flight per worker (items numbered from
    ``offset``, new ones each time: a fenced item answered before would not be sent again)."""
    per = max(1, items // len(workers))

    def run(w: Ways) -> None:
        fn = getattr(w, name)
        for i in range(per):
            fn(offset + i)

    start = time.perf_counter()
    with ThreadPoolExecutor(len(workers)) as pool:
        list(pool.map(run, workers))
    return per * len(workers), time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--one-key", action="store_true")
    args = parser.parse_args(argv)
    processor = ProcessorProcess(
        Path(tempfile.mkdtemp(prefix="eo-bench-")) / "processor.log",
        latency=args.latency_ms / 1000,
    )
    url = processor.start()
    lease_dsn = create_database(args.dsn, "eo_bench_leases")
    sink_dsn = create_database(args.dsn, "eo_bench_sink")
    workers: list[Ways] = []
    many: Many | None = None
    try:
        migrate(lease_dsn, LEASE_STORE)
        migrate(sink_dsn, SINK_FENCE)
        with psycopg.connect(sink_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_commit (k integer PRIMARY KEY, n bigint NOT NULL)")
        with LeaseStore(lease_dsn) as store:
            shared = None
            if args.one_key:  # one run's items in flight together: one lease, one fence row
                key = f"bench_billing/charge/{DAY}-{uuid.uuid4().hex[:8]}"
                shared = store.acquire(key, Holder.process("bench"), ttl=600).lease
            workers = [Ways(url, store, sink_dsn, n, shared) for n in range(IN_FLIGHT)]
            many = Many(url, store, sink_dsn)
            load = os.getloadavg()[0]
            result: dict[str, Any] = {
                "processor_latency_ms": args.latency_ms,
                "one_key": args.one_key,
            }
            result.update(_measure(workers, many, args.items, args.rounds))
            # the machine's 1-minute load average before and after: other work on its cores
            result["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    finally:
        for w in workers:
            w.close()
        if many is not None:
            many.close()
        processor.stop()
        drop_database(args.dsn, lease_dsn)
        drop_database(args.dsn, sink_dsn)
    print(json.dumps(result))
    return 0


def _measure(workers: list[Ways], many: Many, items: int, rounds: int) -> dict[str, Any]:
    first = workers[0]
    for w in workers:  # warm every worker's both ways up (connections, caches)
        for i in range(3):
            w.bare(-1 - i)
            w.fenced(-1 - i)
    many.run(IN_FLIGHT, -1000)
    lat: dict[str, list[float]] = {"bare": [], "fenced": [], "commit": []}
    made: dict[str, int] = {"bare": 0, "fenced": 0, "many": 0}
    took: dict[str, float] = {"bare": 0.0, "fenced": 0.0, "many": 0.0}
    turns = (("bare", "fenced", "many"), ("many", "fenced", "bare"))
    per_round = max(1, items // rounds)
    slice_items = max(IN_FLIGHT, per_round * 2 // SLICES)
    for r in range(rounds):
        offset = r * 100_000
        for name, got in one_at_a_time(first, per_round, offset).items():
            lat[name] += got
        # in short slices, the ways in turn: the machine's load changes over a run
        for s in range(SLICES):
            for name in turns[(r + s) % 2]:
                at = offset + 50_000 + s * 5000
                if name == "many":
                    calls, seconds = many.run(slice_items, at)
                else:
                    calls, seconds = in_flight(workers, name, slice_items, at)
                made[name] += calls
                took[name] += seconds
        print(f"round {r + 1}: done", file=sys.stderr)
    commit = percentile(lat.pop("commit"), 50)
    p50 = {n: percentile(v, 50) for n, v in lat.items()}
    p99 = {n: percentile(v, 99) for n, v in lat.items()}
    throughput = {n: made[n] / took[n] for n in made}
    result = {
        "items_per_way": len(lat["bare"]),
        "p50_ms": {n: round(v, 2) for n, v in p50.items()},
        "p99_ms": {n: round(v, 2) for n, v in p99.items()},
        "p50_added_ms": round(p50["fenced"] - p50["bare"], 2),
        # one durable commit on the sink at the same moments: the fence adds two
        "commit_p50_ms": round(commit, 2),
        "in_flight": IN_FLIGHT,
        "calls_per_s": {n: round(v, 1) for n, v in throughput.items()},
        "throughput_ratio": round(throughput["fenced"] / throughput["bare"], 3),
        "call_many_ratio": round(throughput["many"] / throughput["bare"], 3),
    }
    print(
        f"p50 per call: bare {p50['bare']:.2f} ms, fenced {p50['fenced']:.2f} ms "
        f"(+{result['p50_added_ms']} ms; one durable commit {commit:.2f} ms); at {IN_FLIGHT} "
        "in flight: bare "
        f"{throughput['bare']:.0f}/s, fenced {throughput['fenced']:.0f}/s "
        f"(ratio {result['throughput_ratio']}), call_many {throughput['many']:.0f}/s "
        f"(ratio {result['call_many_ratio']})"
    )
    return result


if __name__ == "__main__":
    sys.exit(main())
