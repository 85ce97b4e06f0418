"""The watcher's reads of the lease store, and the judgement of one DAG over a window."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from airflow_plugins.watcher.gaps import ExpectedRun, LeaseRow, RunReport, WatchedDag, judge
from airflow_plugins.watcher.gaps import expected_runs as _expected_runs
from airflow_plugins.watcher.queries import query


def _period_range(runs: list[ExpectedRun]) -> dict[str, str]:
    periods = [run.business_date for run in runs]
    return {"first_period": min(periods), "last_period": max(periods)}


def dag_leases(
    conn: psycopg.Connection[Any], dag_id: str, runs: list[ExpectedRun], *, lags: bool = True
) -> list[LeaseRow]:
    """The lease rows of ``dag_id`` for the business periods of ``runs``.

    With ``lags``, each row's first grant is read from the audit trail (for schedule lags);
    without, the current grant stands for it (gap detection alone, over long periods).
    """
    if not runs:
        return []
    with conn.cursor(row_factory=dict_row) as cur:
        name = "dag_leases" if lags else "dag_leases_plain"
        cur.execute(query(name), {"dag_id": dag_id, **_period_range(runs)})
        return [LeaseRow.from_row(row) for row in cur.fetchall()]


def reported_missed(
    conn: psycopg.Connection[Any], dag_id: str, runs: list[ExpectedRun]
) -> set[str]:
    """Keys of the missed runs already reported (audit rows ``missed_run``)."""
    if not runs:
        return set()
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("reported_missed"), {"dag_id": dag_id, **_period_range(runs)})
        return {row["key"] for row in cur.fetchall()}


def evaluate(
    conn: psycopg.Connection[Any],
    dag: WatchedDag,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    lags: bool = True,
) -> list[RunReport]:
    """Judges every run ``dag`` expected between ``start`` and ``end`` (scheduled times).

    ``lags=False`` skips the first-grant lookup: the verdicts are the same, the start lags
    are measured to the current grant (cheaper over a year of runs).
    """
    runs = list(_expected_runs(dag, start, end))
    return judge(dag, runs, dag_leases(conn, dag.dag_id, runs, lags=lags), now)
