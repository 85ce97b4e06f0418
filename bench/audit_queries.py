"""Audit and gap-detection queries on a peak day: 10M audit rows, on the real Postgres.

Builds a fresh lease-store database (migrated as in production), fills it with a month-end
peak day: 10M audit rows for 2.5M protected executions of 50,000 DAGs (grant, completion and
blocked duplicates), their lease rows, and a year of an hourly two-task DAG's leases. Then times,
warm, the two questions the views and the watcher ask:

1. "did ``billing_nightly`` run for 2024-02-15, exactly once?" (the audit page's answer:
   every audit row and lease of the DAG's keys for the date, judged) -- target < 50 ms;
2. gap detection over a year for one DAG (8,760 expected hourly runs from Airflow's timetable
   against the DAG's leases) -- target < 1 s.

    .venv/bin/python bench/audit_queries.py [--rows 10000000] [--keep]

The last line is one JSON object with the measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from psycopg import sql

from airflow_plugins.lease import LEASE_STORE, LeaseStore, migrate

ADMIN_DSN = os.environ.get("EXACTLY_ONCE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
DAY = "2024-02-15"
TARGET_AUDIT_MS = 50.0
TARGET_GAPS_MS = 1000.0


# a year of an hourly DAG with two protected tasks, with 5 runs missing


def _blocks() -> dict[str, str]:
    text = (Path(__file__).parent / "audit_fill.sql").read_text()
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


BILLING = [
    ("acquire", "granted", None),
    ("acquire", "held", None),
    ("complete", "succeeded", 14_400_000),
    ("acquire", "succeeded", None),
]


def timed(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    """Runs ``fn`` once to warm, then ``repeat`` times; milliseconds (median, p95, max)."""
    fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {
        "median_ms": round(statistics.median(samples), 2),
        "p95_ms": round(samples[max(0, int(len(samples) * 0.95) - 1)], 2),
        "max_ms": round(samples[-1], 2),
    }


def fill(dsn: str, rows: int) -> dict[str, float]:
    """Fills the database; returns how long each part took (s)."""
    took: dict[str, float] = {}
    queries = _blocks()
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        conn.execute(queries["fill_audit"], {"day": DAY, "rows": rows})
        took["audit_rows_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        conn.execute(queries["fill_leases"], {"day": DAY, "jobs": rows // 4})
        start = datetime(2024, 1, 1, tzinfo=UTC)
        conn.execute(queries["fill_year"], {"start": start, "end": start + timedelta(days=365)})
        took["lease_rows_s"] = round(time.perf_counter() - t0, 1)
        conn.execute("VACUUM ANALYZE runlease.audit")
        conn.execute("VACUUM ANALYZE runlease.lease")
    with LeaseStore(dsn) as store:
        from airflow_plugins.lease import Holder

        holder = Holder.airflow(
            dag_id="billing_nightly", run_id="scheduled__2024-02-15", task_id="charge", try_number=1
        )
        for event, outcome, duration in BILLING:
            store.record_event(
                f"billing_nightly/charge/{DAY}",
                event,
                outcome=outcome,
                holder=holder,
                token=7,
                business_date=datetime(2024, 2, 15).date(),
                duration_ms=duration,
                input={"customers": 340} if outcome == "granted" else None,
                output={"charged": 340} if event == "complete" else None,
            )
    return took


def main(argv: list[str] | None = None) -> int:
    """Builds the peak day, times both questions, prints the verdicts and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000, help="audit rows (a peak day)")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args(argv)

    from airflow.timetables.trigger import CronTriggerTimetable

    from airflow_plugins.lease.keys import Period
    from airflow_plugins.views.pages import audit_page
    from airflow_plugins.watcher import RunStatus, WatchedDag, evaluate
    from airflow_plugins.watcher.dags import TimetableSchedule

    name = f"eobench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(ADMIN_DSN, dbname=name)
    try:
        migrate(dsn, LEASE_STORE)
        print(f"filling {args.rows:,} audit rows (a peak day) ...", flush=True)
        took = fill(dsn, args.rows)
        with LeaseStore(dsn) as store, psycopg.connect(dsn, autocommit=True) as conn:
            counted = conn.execute("SELECT count(*) FROM runlease.audit").fetchone()
            assert counted is not None
            result, _ = audit_page(store, "billing_nightly", DAY, 2000)
            verdict = result.verdict.value
            audit = timed(lambda: audit_page(store, "billing_nightly", DAY, 2000), args.repeat)

            start = datetime(2024, 1, 1, tzinfo=UTC)
            dag = WatchedDag(
                dag_id="rollup_hourly",
                schedule=TimetableSchedule(CronTriggerTimetable("0 * * * *", timezone="UTC")),
                period=Period.HOUR,
                deadline=timedelta(hours=1),
                tasks=("aggregate", "publish"),
            )
            end = start + timedelta(days=365) - timedelta(hours=1)
            now = end + timedelta(days=1)
            with store.connection() as lease_conn:
                reports = evaluate(lease_conn, dag, start, end, now, lags=False)
                missed = [r.run.business_date for r in reports if r.status is RunStatus.MISSED]
                gaps = timed(
                    lambda: evaluate(lease_conn, dag, start, end, now, lags=False),
                    max(5, args.repeat // 5),
                )
        figures = {
            "audit_rows": counted[0],
            "fill": took,
            "did_it_run_exactly_once": {**audit, "target_ms": TARGET_AUDIT_MS, "verdict": verdict},
            "gap_detection_one_dag_one_year": {
                **gaps,
                "target_ms": TARGET_GAPS_MS,
                "expected_runs": len(reports),
                "missed": len(missed),
            },
        }
        print(f"audit rows                          {counted[0]:>12,}")
        print(
            f"did it run, exactly once? ({verdict})  median {audit['median_ms']:8.2f} ms  "
            f"p95 {audit['p95_ms']:8.2f} ms  target {TARGET_AUDIT_MS:.0f} ms  "
            f"ratio {TARGET_AUDIT_MS / max(audit['p95_ms'], 1e-3):6.1f}x"
        )
        print(
            f"gaps, one DAG, one year ({len(reports)} runs, {len(missed)} missed)  median "
            f"{gaps['median_ms']:8.2f} ms  p95 {gaps['p95_ms']:8.2f} ms  target "
            f"{TARGET_GAPS_MS:.0f} ms  ratio {TARGET_GAPS_MS / max(gaps['p95_ms'], 1e-3):6.1f}x"
        )
        ok = (
            verdict == "exactly once"
            and len(missed) == 5
            and audit["p95_ms"] < TARGET_AUDIT_MS
            and gaps["p95_ms"] < TARGET_GAPS_MS
        )
        figures["within_targets"] = ok
        print(json.dumps(figures))
        return 0 if ok else 1
    finally:
        if not args.keep:
            with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


if __name__ == "__main__":
    sys.exit(main())
