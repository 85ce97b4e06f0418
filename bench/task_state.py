"""What the lease's durable task state costs per call, side by side with a lease renewal.

    .venv/bin/python bench/task_state.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
                                         [--rounds 300]

It makes a lease store in a new database of the server (dropped at the end), holds one lease,
and times, interleaved round by round on the store's open connection: a renew (the keeper's
single-row, token-guarded update: the reference), a ``get``, a fenced ``set`` (lease row locked
FOR SHARE, upsert, audit row), and a whole ``submit_once`` of a new job name (intent, submit,
record: two fenced statements) with a no-op submit. A durable operator pays one
``submit_once`` and a ``get`` per try; the rest of its time is the job's.

Progress goes to stderr; the last line of stdout is one JSON object: p50 / p99 milliseconds of
each call and each p50 over the renew's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

from airflow_plugins.demo.deployment import create_database, drop_database
from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore, TaskState, migrate


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the rounds; prints the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    dsn = create_database(args.dsn, "bench_state")
    try:
        migrate(dsn, LEASE_STORE)
        with LeaseStore(dsn, ttl=600) as store:
            lease = store.acquire("bench/state/2024-02-15", Holder.process("bench")).lease
            state = TaskState(store, lease)
            state.set("job_id", "job-0")
            calls: dict[str, Callable[[int], object]] = {
                "renew": lambda n: store.renew(lease),
                "get": lambda n: state.get("job_id"),
                "set": lambda n: state.set("progress", {"done": n}),
                "submit_once": lambda n: state.submit_once(f"job-{n}", lambda intent: f"j{n}"),
            }
            times: dict[str, list[float]] = {name: [] for name in calls}
            for n in range(args.rounds):
                for name, call in calls.items():
                    started = time.perf_counter()
                    call(n)
                    times[name].append((time.perf_counter() - started) * 1000)
                if n % 100 == 0:
                    print(f"round {n}", file=sys.stderr)
    finally:
        drop_database(args.dsn, dsn)
    p50 = {name: percentile(t, 50) for name, t in times.items()}
    out = {
        "rounds": args.rounds,
        **{f"{name}_p50_ms": round(v, 3) for name, v in p50.items()},
        **{f"{name}_p99_ms": round(percentile(t, 99), 3) for name, t in times.items()},
        **{f"{name}_over_renew": round(v / p50["renew"], 2) for name, v in p50.items()},
    }
    print(f"{'call':<12} {'p50 ms':>8} {'p99 ms':>8} {'x renew':>8}", file=sys.stderr)
    for name in calls:
        print(
            f"{name:<12} {p50[name]:>8.3f} {out[f'{name}_p99_ms']:>8.3f} "
            f"{out[f'{name}_over_renew']:>8.2f}",
            file=sys.stderr,
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
