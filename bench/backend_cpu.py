"""What one protected try costs the lease store's server, on a new backend, step by step.

    .venv/bin/python bench/backend_cpu.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
                                          [--tries 200]

Each try is made through ``LeaseStore`` on a new connection and key, as a task process's one
connection is a new backend, and the backend's CPU (``/proc/<pid>/schedstat``) is read after
each step: its start, the warm-up, the acquire, the complete; interleaved, the same try without
the warm-up. The server must run on this host with its ``/proc`` readable; the bench makes and
drops its own database. The last line of stdout is one JSON object with the medians in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import uuid
from datetime import date
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore, migrate

DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = "eo_bench_backend_cpu"


def backend_cpu_ms(pid: int) -> float:
    """The server process's CPU so far (its run time in the kernel's schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6


def one_try(dsn: str, *, warm: bool) -> dict[str, float]:
    """One protected try on a new backend; the server CPU of each of its steps."""
    holder = Holder(engine="airflow", dag_id="bench", run_id="r", task_id="t")
    spent: dict[str, float] = {}
    with LeaseStore(dsn) as store:
        if warm:
            store.warm_up()
        with store.connection() as conn:  # the kept one, opened by warm_up or now
            pid = conn.info.backend_pid
        # without the warm-up, a connection opened here ran nothing yet: its CPU so far is its
        # start; with it, its start and the warm-up's statement
        before = backend_cpu_ms(pid)
        spent["start_and_warm_up" if warm else "start"] = before
        acquisition = store.acquire(
            f"bench/t/{uuid.uuid4()}", holder, ttl=60, business_date=date.today()
        )
        if acquisition.lease is None:
            raise RuntimeError(f"a new key was not granted: {acquisition}")
        after_acquire = backend_cpu_ms(pid)
        store.complete(acquisition.lease, None)
        after_complete = backend_cpu_ms(pid)
    spent["acquire"] = after_acquire - before
    spent["complete"] = after_complete - after_acquire
    spent["total"] = after_complete
    return spent


def median(rows: list[dict[str, float]], step: str) -> float:
    return round(statistics.median(r[step] for r in rows), 3)


def main(argv: list[str] | None = None) -> int:
    """Runs the bench; prints progress to stderr and the figures as JSON on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN of the server")
    parser.add_argument("--tries", type=int, default=200, help="tries of each kind")
    args = parser.parse_args(argv)
    if args.tries < 1:
        parser.error("--tries must be at least 1")
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
    dsn = psycopg.conninfo.make_conninfo(args.dsn, dbname=DB)
    try:
        migrate(dsn, LEASE_STORE)
        try:
            with psycopg.connect(dsn) as probe:
                backend_cpu_ms(probe.info.backend_pid)
        except OSError as exc:
            print(
                f"cannot read the server's process CPU ({exc}): run this on the lease store's "
                "host, as root or as the server's user",
                file=sys.stderr,
            )
            return 2
        warmed: list[dict[str, float]] = []
        cold: list[dict[str, float]] = []
        for n in range(args.tries):  # interleaved, so drift hits both alike
            warmed.append(one_try(dsn, warm=True))
            cold.append(one_try(dsn, warm=False))
            if (n + 1) % 50 == 0:
                print(f"{n + 1}/{args.tries} tries of each kind", file=sys.stderr)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB))
            )
    figures: dict[str, Any] = {
        "tries_per_kind": args.tries,
        "server_cpu_ms_p50": {
            "with_warm_up": {
                "start_and_warm_up": median(warmed, "start_and_warm_up"),
                "acquire": median(warmed, "acquire"),
                "complete": median(warmed, "complete"),
                "total": median(warmed, "total"),
            },
            "without_warm_up": {
                "start": median(cold, "start"),
                "acquire": median(cold, "acquire"),
                "complete": median(cold, "complete"),
                "total": median(cold, "total"),
            },
        },
    }
    with_total = figures["server_cpu_ms_p50"]["with_warm_up"]["total"]
    without_total = figures["server_cpu_ms_p50"]["without_warm_up"]["total"]
    with_path = (
        figures["server_cpu_ms_p50"]["with_warm_up"]["acquire"]
        + figures["server_cpu_ms_p50"]["with_warm_up"]["complete"]
    )
    without_path = (
        figures["server_cpu_ms_p50"]["without_warm_up"]["acquire"]
        + figures["server_cpu_ms_p50"]["without_warm_up"]["complete"]
    )
    figures["ratios"] = {
        # > 1: the warm-up costs the server more in all than it moves off the try's path
        "total_with_over_without_warm_up": round(with_total / without_total, 3),
        "on_the_try_path_with_over_without_warm_up": round(with_path / without_path, 3),
    }
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
