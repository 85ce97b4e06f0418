"""What a protected try's two durable round trips (acquire, complete) take, side by side: on a
connection opened for the try (as a task process without an agent), on a connection already
open, and through a lease agent; on idle cores and with every core kept busy.

    .venv/bin/python bench/round_trips.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
                                          [--tries 200]

It makes a lease store in a new database of the server (dropped at the end), starts a lease
agent (``runlease agent``) for it, and times ``--tries`` acquire + complete pairs of new keys
each way, interleaved, first on idle cores, then with one busy-looping process per core (a
saturated host, as the Airflow bench's). This is the floor under the time the plugin adds
inside a task: both commits must be durable before the work and before the task goes on, and
each hop waits for a core when the cores are busy.

Progress goes to stderr; the last line of stdout is one JSON object: p50 / p99 milliseconds per
way and load, and each way's p50 over the open connection's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from airflow_plugins.demo.deployment import create_database, drop_database
from airflow_plugins.demo.stack import wait_until
from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore, migrate
from airflow_plugins.lease.agent_client import AgentClient

WAYS = ("new_connection", "open_connection", "agent")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """``count`` processes that spin until the block ends (stopped by their pids)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for proc in spinners:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def timed_tries(ways: dict[str, Callable[[str], None]], tries: int) -> dict[str, list[float]]:
    """Milliseconds per try for each way, the ways interleaved try by try."""
    spent: dict[str, list[float]] = {way: [] for way in ways}
    for n in range(tries):
        for way, one_try in ways.items():
            started = time.perf_counter()
            one_try(f"bench/round-trips/{way}/{uuid.uuid4().hex}/{n}")
            spent[way].append((time.perf_counter() - started) * 1000)
    return spent


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the bench; the last line of stdout is its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--tries", type=int, default=200, help="tries per way and load")
    args = parser.parse_args(argv)

    dsn = create_database(args.dsn, "eo_bench_round_trips")
    folder = Path(tempfile.mkdtemp(prefix="eo-bench-round-trips-"))
    socket_path = str(folder / "agent.sock")
    agent: subprocess.Popen[bytes] | None = None
    holder = Holder.process("bench-round-trips")
    try:
        migrate(dsn, LEASE_STORE)
        agent = subprocess.Popen(
            [str(Path(sys.executable).with_name("runlease")), "--dsn", dsn, "agent",
             "--socket", socket_path],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        open_store = LeaseStore(dsn)
        agent_store = LeaseStore(dsn, agent_socket=socket_path)
        wait_until(AgentClient(socket_path, dsn, timeout=10).ping, timeout=30, what="lease agent")

        def new_connection(key: str) -> None:
            with LeaseStore(dsn) as store:
                store.complete(store.acquire(key, holder).lease, 1)

        def on(store: LeaseStore) -> Callable[[str], None]:
            return lambda key: store.complete(store.acquire(key, holder).lease, 1)

        ways = {"new_connection": new_connection, "open_connection": on(open_store)}
        ways["agent"] = on(agent_store)
        timed_tries(ways, 20)  # warm: caches, the agent's connections, prepared statements
        figures: dict[str, dict[str, dict[str, float]]] = {}
        for load in ("idle", "busy"):
            print(f"{args.tries} tries each way, {load} cores", file=sys.stderr)
            if load == "busy":
                with busy_cores(os.cpu_count() or 1):
                    spent = timed_tries(ways, args.tries)
            else:
                spent = timed_tries(ways, args.tries)
            base = percentile(spent["open_connection"], 50)
            figures[load] = {
                way: {
                    "p50_ms": round(percentile(values, 50), 2),
                    "p99_ms": round(percentile(values, 99), 2),
                    "p50_over_open_connection": round(percentile(values, 50) / base, 2),
                }
                for way, values in spent.items()
            }
        open_store.close()
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
        drop_database(args.dsn, dsn)
    for load, ways_figures in figures.items():
        for way, figure in ways_figures.items():
            print(f"{load:<5} {way:<16} p50 {figure['p50_ms']} ms, p99 {figure['p99_ms']} ms")
    print(json.dumps({"cores": os.cpu_count(), "tries": args.tries} | figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
