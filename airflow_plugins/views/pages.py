"""What each page shows, read from the lease store (and the bridge's tables), as plain data.

No HTTP here: ``app`` turns these into pages. Every read is a named query of ``sql/queries.sql``
or a public read of the lease store or the bridge. What a row holds of a task's payloads (a
lease's result and error, an audit row's input, output and reason) is masked here, for every
page: the lease store keeps the result itself faithful, since later runs are handed it back.
Each page reads at most a bounded number of rows (``MAX_RUNS`` runs for the run pages), and
only of the DAGs the user may read (``dags``: None for all).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg

from airflow_plugins.lease import LeaseStore, masking
from airflow_plugins.lease.keys import FOLD_SUFFIX
from airflow_plugins.protection import sla
from airflow_plugins.views import charts
from airflow_plugins.views.audit_answer import RunAnswer, answer
from airflow_plugins.views.queries import query
from airflow_plugins.watcher.gaps import RunReport, RunStatus, WatchedDag, expected_runs, judge
from airflow_plugins.watcher.reads import dag_leases

DagSource = Callable[[datetime], list[WatchedDag]]
Readable = Collection[str] | None
MAX_RUNS = 2000
PAYLOAD_COLUMNS = ("result", "error", "reason", "input", "output", "detail", "differences")
OUTCOME_CSS = {
    "granted": "s-ok",
    "taken_over": "s-warn",
    "held": "s-block",
    "succeeded": "s-dup",
    "refused": "s-bad",
}


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` as a page shows it: its payload columns masked."""
    return {k: masking.mask(v) if k in PAYLOAD_COLUMNS else v for k, v in row.items()}


def _rows(store: LeaseStore, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    if "dags" in params and params["dags"] is not None:
        params = {**params, "dags": sorted(params["dags"])}
    with store.connection() as conn:
        return [shown(row) for row in conn.execute(query(name), params).fetchall()]


def readable(dags: Readable, dag_id: str) -> bool:
    """Whether ``dag_id`` is among the readable DAGs (None: all are)."""
    return dags is None or dag_id in dags


@dataclasses.dataclass
class LeasesPage:
    """The leases page: live holders, counts, takeovers and blocked duplicates, one chart."""

    live: list[dict[str, Any]]
    listed: list[dict[str, Any]]
    counts: dict[str, dict[str, int]]
    takeovers: list[dict[str, Any]]
    blocked: list[dict[str, Any]]
    chart: str


def leases_page(
    store: LeaseStore,
    *,
    prefix: str | None,
    state: str | None,
    expired_only: bool,
    taken_over_only: bool,
    hours: int,
    limit: int,
    dags: Readable = None,
) -> LeasesPage:
    """Reads the leases page's data (filters as on the page)."""
    live = _rows(store, "live_leases", {"prefix": prefix, "limit": limit, "dags": dags})
    listed = [
        shown(row)
        for row in store.list_leases(
            prefix=prefix,
            state=state,
            expired_only=expired_only,
            taken_over_only=taken_over_only,
            dags=dags,
            limit=limit,
        )
    ]
    counts = {
        r["state"]: {"n": r["n"], "taken_over": r["taken_over"], "expired": r["expired"]}
        for r in _rows(store, "lease_counts", {"prefix": prefix, "dags": dags})
    }
    outcome_rows = _rows(
        store, "acquire_outcomes_by_hour", {"hours": hours, "prefix": prefix, "dags": dags}
    )
    takeovers = _rows(
        store,
        "recent_outcomes",
        {
            "hours": hours,
            "outcomes": ["taken_over"],
            "prefix": prefix,
            "limit": limit,
            "dags": dags,
        },
    )
    blocked = _rows(
        store,
        "recent_outcomes",
        {
            "hours": hours,
            "outcomes": ["held", "succeeded", "refused"],
            "prefix": prefix,
            "limit": limit,
            "dags": dags,
        },
    )
    return LeasesPage(live, listed, counts, takeovers, blocked, _outcome_chart(outcome_rows, hours))


def _outcome_chart(rows: Sequence[dict[str, Any]], hours: int) -> str:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    slots = [now - timedelta(hours=h) for h in range(hours - 1, -1, -1)]
    labels = [slot.strftime("%H:00") for slot in slots]
    series = []
    for outcome, css in OUTCOME_CSS.items():
        counts = {r["hour"].astimezone(UTC): r["n"] for r in rows if r["outcome"] == outcome}
        series.append(
            charts.Series(
                outcome.replace("_", " "),
                [
                    (label, float(counts.get(slot, 0)))
                    for label, slot in zip(labels, slots, strict=True)
                ],
                css,
            )
        )
    return charts.bars(f"Acquire outcomes per hour, last {hours} h", series)


def audit_page(
    store: LeaseStore, dag_id: str, business_date: str, limit: int
) -> tuple[RunAnswer, str]:
    """The audit answer of one DAG and business date, and a timeline of its tries."""
    params = {
        "dag_id": dag_id,
        "period_from": business_date,
        "period_to": business_date + "~",  # '~' sorts after every character of a period
        # the same period's second occurrence is another period (keys.FOLD_SUFFIX)
        "fold_from": business_date + FOLD_SUFFIX,
        "fold_to": business_date + FOLD_SUFFIX + "~",
        "limit": limit,
    }
    rows = _rows(store, "audit_of_run", params)
    leases = _rows(store, "leases_of_run", params)
    result = answer(dag_id, business_date, rows, leases)
    spans = []
    now = datetime.now(UTC)
    for key in result.keys:
        for attempt in key.tries:
            end = attempt.ended_at or now
            css = {"succeeded": "s-ok", "superseded": "s-warn", "running": "s1"}.get(
                attempt.outcome, "s-bad"
            )
            spans.append(
                charts.Span(
                    row=_row_label(key.key, attempt.token),
                    start=attempt.granted_at.timestamp(),
                    end=end.timestamp(),
                    css=css,
                    label=f"token {attempt.token} {attempt.holder}: {attempt.outcome}",
                )
            )
    return result, charts.timeline(f"Tries of {dag_id} for {business_date}", spans)


def _row_label(key: str, token: int | None) -> str:
    """``charge #42`` (``send/tenant-7 #43`` for a mapped task; ``~shadow`` for a shadow key)."""
    parts = key.split("/")
    label = parts[1] + (f"/{parts[3]}" if len(parts) > 3 else "")
    if "#shadow" in key:
        label += " ~shadow"
    return f"{label.removesuffix('#shadow')} #{token}"


@dataclasses.dataclass
class RunsPage:
    """Late and missed runs over a period and the schedule-lag SLA.

    ``more_since`` is set when the period held more than ``MAX_RUNS`` runs: the page shows the
    first ones, and the next page starts at that scheduled time.
    """

    reports: list[RunReport]
    gaps: list[RunReport]
    summary: sla.LagSummary
    lag_chart: str
    dags: list[str]
    more_since: datetime | None = None


def judged_runs(
    conn: Any, dag: WatchedDag, since: datetime, until: datetime, now: datetime, budget: int
) -> tuple[list[RunReport], datetime | None]:
    """The first ``budget`` runs of ``dag`` in ``[since, until]``, judged, and where more start.

    The schedule is read lazily, so a minutely DAG over a year costs ``budget`` runs, not 500k.
    """
    runs = list(itertools.islice(expected_runs(dag, since, until), budget + 1))
    more = runs[budget].scheduled_at if len(runs) > budget else None
    runs = runs[:budget]
    return judge(dag, runs, dag_leases(conn, dag.dag_id, runs), now), more


def runs_page(
    store: LeaseStore,
    dags: DagSource,
    *,
    dag_id: str | None,
    since: datetime,
    until: datetime,
    readable_dags: Readable = None,
    max_runs: int = MAX_RUNS,
) -> RunsPage:
    """Judges every watched DAG the user may read (or one) over ``[since, until]``.

    At most ``max_runs`` runs in all; past them the page says where the next one starts.
    """
    now = datetime.now(UTC)
    watched = [d for d in dags(now) if readable(readable_dags, d.dag_id)]
    reports: list[RunReport] = []
    more: datetime | None = None
    with store.connection() as conn:
        for dag in sorted(watched, key=lambda d: d.dag_id):
            if dag_id and dag.dag_id != dag_id:
                continue
            budget = max_runs - len(reports)
            if budget <= 0:
                more = since
                break
            judged, later = judged_runs(conn, dag, since, until, now, budget)
            reports.extend(judged)
            if later is not None:
                more = later if more is None else min(more, later)
    reports.sort(key=lambda r: r.run.scheduled_at)
    return RunsPage(
        reports=reports,
        gaps=[r for r in reports if r.is_gap],
        summary=sla.summarise(
            r.start_lag.total_seconds() for r in reports if r.start_lag is not None
        ),
        lag_chart=lag_chart(reports),
        dags=sorted(d.dag_id for d in watched),
        more_since=more,
    )


def lag_chart(reports: Sequence[RunReport]) -> str:
    """Start and finish lags (seconds) per run against the 60 s and 5 min targets."""
    done = [r for r in reports if r.status is RunStatus.DONE][-120:]
    label = "%m-%d %H:%M"
    start = charts.Series(
        "scheduled -> granted",
        [(r.run.scheduled_at.strftime(label), _seconds(r.start_lag)) for r in done],
        "s1",
    )
    finish = charts.Series(
        "scheduled -> finished",
        [(r.run.scheduled_at.strftime(label), _seconds(r.finish_lag)) for r in done],
        "s2",
    )
    return charts.lines(
        "Schedule lag per run (s)",
        [start, finish],
        unit="s",
        thresholds=[
            charts.Threshold("60 s (p95 target)", sla.START_TARGET.total_seconds()),
            charts.Threshold("5 min (p99.9 target)", sla.TAIL_TARGET.total_seconds()),
        ],
    )


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else round(delta.total_seconds(), 1)


@dataclasses.dataclass
class DagMigration:
    """One DAG's migration state: mode, comparisons, readiness and charts."""

    dag_id: str
    mode: str
    changed_by: str | None
    changed_at: datetime | None
    reason: str | None
    comparisons: list[dict[str, Any]]
    divergences: list[dict[str, Any]]
    waiting: list[dict[str, Any]]  # finished shadows whose comparison waits, and why
    ready: bool
    ready_after: int
    duration_chart: str
    lag_chart: str


def migration_page(
    store: LeaseStore,
    dags: DagSource,
    *,
    ready_after: int,
    days: int,
    readable_dags: Readable = None,
    max_runs: int = MAX_RUNS,
) -> tuple[list[DagMigration], list[str]]:
    """Every DAG with a cutover mode (and every watched DAG) the user may read, with its
    comparisons (each DAG's lag chart over at most ``max_runs`` runs).

    Returns the DAGs and the valid mode names.
    """
    from bridge.comparison import recent, waits
    from bridge.cutover import CutoverMode, ModeStore

    try:
        modes = {row["dag_id"]: row for row in ModeStore(store).describe()}
    except psycopg.errors.UndefinedTable:  # the bridge's tables are not migrated here yet
        modes = {}
    now = datetime.now(UTC)
    watched = {d.dag_id: d for d in dags(now)}
    result = []
    for dag_id in sorted(set(modes) | set(watched)):
        if not readable(readable_dags, dag_id):
            continue
        row = modes.get(dag_id, {})
        compared = [shown(c) for c in recent(store, dag_id, 60)] if modes else []
        lags: list[RunReport] = []
        if dag_id in watched:
            with store.connection() as conn:
                since = now - timedelta(days=days)
                lags, _ = judged_runs(conn, watched[dag_id], since, now, now, max_runs)
        last = compared[:ready_after]
        result.append(
            DagMigration(
                dag_id=dag_id,
                mode=row.get("mode", CutoverMode.AIRFLOW.value),
                changed_by=row.get("changed_by"),
                changed_at=row.get("changed_at"),
                reason=row.get("reason"),
                comparisons=compared,
                divergences=[c for c in compared if c.get("matched") is False],
                waiting=waits(store, dag_id) if modes else [],
                ready=len(last) >= ready_after and all(c.get("matched") for c in last),
                ready_after=ready_after,
                duration_chart=_duration_chart(dag_id, compared),
                lag_chart=lag_chart(lags),
            )
        )
    return result, [m.value for m in CutoverMode]


def _duration_chart(dag_id: str, compared: Sequence[dict[str, Any]]) -> str:
    ordered = sorted(compared, key=lambda c: str(c["business_date"]))
    primary = charts.Series(
        "primary (" + (ordered[-1]["primary_engine"] if ordered else "airflow") + ")",
        [(str(c["business_date"]), _ms_to_s(c.get("primary_ms"))) for c in ordered],
        "s1",
    )
    shadow = charts.Series(
        "shadow",
        [(str(c["business_date"]), _ms_to_s(c.get("shadow_ms"))) for c in ordered],
        "s2",
    )
    return charts.lines(f"{dag_id}: run duration per business date (s)", [primary, shadow], "s")


def _ms_to_s(value: Any) -> float | None:
    return None if value is None else round(float(value) / 1000.0, 2)


def parse_day(text: str | None, default: date) -> date:
    """A date from a query parameter (``YYYY-MM-DD``), or ``default``."""
    return date.fromisoformat(text) if text else default
