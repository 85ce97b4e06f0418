"""Run comparison: a shadow run against the primary's run of the same business date.

Both sides are read from what each engine recorded, not from what it says about itself: the
primary's side from its lease rows (status, duration, result) and its sink's ledger (the items
it wrote); the shadow's from its workflow result and the rows its rolled-back transactions
captured. The row, with its differences, is stored in ``bridge.comparison``; a DAG is ready to
cut over after N consecutive matching runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.keys import SHADOW_SUFFIX
from airflow_plugins.protection.config import sink_dsn
from bridge import task_comparison
from bridge.airflow_side import (
    AirflowSideRefused,
    AirflowSideUnavailable,
    airflow_tasks,
    run_id_of,
)
from bridge.graph import run_state_tasks
from bridge.partition import keyed_date
from bridge.spec import DagRunResult, DagSpec
from bridge.sql import query

MAX_LISTED = 20

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CompareInput:
    """A finished shadow run to compare; ``final`` compares even if the primary is unfinished.

    ``source``: who started the shadow; a whole-DAG shadow (``airflow-dagrun:<run id>``) is
    compared task by task with that Airflow run (``bridge.task_comparison``), and its fenced
    tasks' items and external calls with the primary's sink ledger; any other with the
    primary's lease rows and sink ledger.
    """

    spec: DagSpec
    shadow: DagRunResult
    final: bool = False
    source: str = ""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The comparison's verdict: ``pending`` while the primary has not finished."""

    pending: bool
    matched: bool | None = None
    differences: tuple[dict[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class ComparisonRow:
    """One row of ``bridge.comparison``: both engines' sides of a business run and their
    differences (``matched`` is derived: none). The JSON columns default to empty."""

    dag_id: str
    business_date: str
    primary_status: str
    primary_ms: int | None
    shadow_status: str
    shadow_ms: int | None
    differences: list[dict[str, Any]]
    primary_engine: str = "airflow"
    primary_digests: dict[str, str] = dataclasses.field(default_factory=dict)
    primary_items: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    shadow_digests: dict[str, str] = dataclasses.field(default_factory=dict)
    shadow_items: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    shadow_rows: dict[str, Any] = dataclasses.field(default_factory=dict)
    primary_calls: dict[str, Any] = dataclasses.field(default_factory=dict)
    shadow_calls: dict[str, Any] = dataclasses.field(default_factory=dict)
    primary_tasks: dict[str, Any] = dataclasses.field(default_factory=dict)
    shadow_tasks: dict[str, Any] = dataclasses.field(default_factory=dict)


def store_comparison(store: LeaseStore, row: ComparisonRow) -> Comparison:
    """Stores ``row`` (one per DAG and business date: a later comparison replaces it)."""
    params: dict[str, Any] = {
        name: Jsonb(value) if isinstance(value, dict | list) else value
        for name, value in dataclasses.asdict(row).items()
    }
    params["matched"] = not row.differences
    run = {"dag_id": row.dag_id, "business_date": row.business_date}
    with store.connection() as conn, conn.transaction():
        conn.execute(query("comparison_upsert"), params)
        conn.execute(query("comparison_wait_clear"), run)
    return Comparison(
        pending=False, matched=not row.differences, differences=tuple(row.differences)
    )


def _pending(
    store: LeaseStore, shadow: DagRunResult, reason: str, *differences: dict[str, Any]
) -> Comparison:
    """A pending verdict, its reason stored for the Migration page and ``bridge compare``
    (``waits``) until the comparison's row replaces it."""
    run = {
        "dag_id": shadow.dag_id,
        "business_date": keyed_date(shadow.business_date, shadow.partition_key),
        "reason": reason,
    }
    with store.connection() as conn:
        conn.execute(query("comparison_wait_upsert"), run)
    return Comparison(pending=True, differences=differences)


def waits(store: LeaseStore, dag_id: str) -> list[dict[str, Any]]:
    """The DAG's finished shadows whose comparison still waits, and why, newest first (none
    before the bridge's schema has its wait table: no comparison can have waited there)."""
    try:
        with store.connection() as conn:
            return conn.execute(query("comparison_waits"), {"dag_id": dag_id}).fetchall()
    except psycopg.errors.UndefinedTable:
        return []


def digest(value: Any) -> str:
    """A stable digest of a JSON value (key order does not matter)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class _Side:
    status: str
    ms: int | None
    digests: dict[str, str]
    items: dict[str, list[str]]
    waiting: list[str] = dataclasses.field(default_factory=list)  # tasks not finished
    calls: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)


def compare_run(store: LeaseStore, inp: CompareInput) -> Comparison:
    """Compares and, unless the primary is still running, stores the comparison row."""
    airflow_run = run_id_of(inp.source)
    if airflow_run is not None:
        return _compare_tasks(store, inp, airflow_run)
    shadow = inp.shadow
    primary = _primary_side(store, inp.spec, shadow)
    if primary.waiting and not inp.final:
        return _pending(store, shadow, "the primary has not finished " + ", ".join(primary.waiting))
    shadow_side = _shadow_side(shadow)
    differences = _differences(primary, shadow_side)
    return store_comparison(
        store,
        ComparisonRow(
            dag_id=shadow.dag_id,
            business_date=keyed_date(shadow.business_date, shadow.partition_key),
            primary_status=primary.status,
            primary_ms=primary.ms,
            shadow_status=shadow_side.status,
            shadow_ms=shadow_side.ms,
            differences=differences,
            primary_digests=primary.digests,
            primary_items=primary.items,
            shadow_digests=shadow_side.digests,
            shadow_items=shadow_side.items,
            shadow_rows=_captured_rows(shadow),
            primary_calls=primary.calls,
            shadow_calls=shadow_side.calls,
        ),
    )


def _captured_rows(shadow: DagRunResult) -> dict[str, Any]:
    """The rows each task's rolled-back transactions captured, by task."""
    return {t: o.captured.get("rows", {}) for t, o in shadow.tasks.items() if o.captured}


def _compare_tasks(store: LeaseStore, inp: CompareInput, airflow_run: str) -> Comparison:
    """A whole-DAG shadow against its Airflow run, task by task (state, XComs, durations), and
    its fenced tasks' effects against the primary's ledger (items written, external calls)."""
    shadow = inp.shadow
    unavailable: dict[str, Any] | None = None
    try:
        primary = airflow_tasks(shadow.dag_id, airflow_run)
    except AirflowSideRefused as exc:  # waiting cannot help: say so now, in the row
        log.error("bridge: comparison of %s %s: %s", shadow.dag_id, shadow.business_date, exc)
        return store_comparison(
            store,
            ComparisonRow(
                dag_id=shadow.dag_id,
                business_date=keyed_date(shadow.business_date, shadow.partition_key),
                primary_status="refused",
                primary_ms=None,
                shadow_status=shadow.status,
                shadow_ms=shadow.duration_ms,
                differences=[{"what": "airflow_api", "reason": str(exc)}],
                shadow_rows=_captured_rows(shadow),
                shadow_calls=_shadow_side(shadow).calls,
                shadow_tasks={
                    t: s.as_row() for t, s in task_comparison.shadow_tasks(shadow).items()
                },
            ),
        )
    except AirflowSideUnavailable as exc:
        unavailable = {"what": "airflow_api", "reason": str(exc)}
        log.warning(
            "bridge: comparison of %s %s waits for Airflow's API: %s",
            shadow.dag_id,
            shadow.business_date,
            exc,
        )
        if not inp.final:
            return _pending(store, shadow, unavailable["reason"], unavailable)
        primary = {}
    decisive = run_state_tasks(inp.spec)
    primary_status = task_comparison.run_state(primary, decisive) if primary else "missing"
    if primary_status == "running" and not inp.final:
        return _pending(store, shadow, "Airflow's run has not finished")
    fenced = _fenced_sides(store, inp.spec, shadow)  # Airflow's run is done: its leases too
    theirs = task_comparison.shadow_tasks(shadow)
    differences = task_comparison.differences(primary, theirs)
    if fenced is not None:
        differences += _effect_differences(*fenced)
    if primary_status != shadow.status:
        differences.insert(
            0, {"what": "status", "primary": primary_status, "shadow": shadow.status}
        )
    if unavailable is not None:
        differences.insert(0, unavailable)
    durations = [t.ms for t in primary.values() if t.ms is not None]
    return store_comparison(
        store,
        ComparisonRow(
            dag_id=shadow.dag_id,
            business_date=keyed_date(shadow.business_date, shadow.partition_key),
            primary_status=primary_status,
            primary_ms=sum(durations) if durations else None,
            shadow_status=shadow.status,
            shadow_ms=shadow.duration_ms,
            differences=differences,
            primary_digests={
                t: digest(s.xcoms) for t, s in primary.items() if s.state == "success"
            },
            shadow_digests={t: digest(s.xcoms) for t, s in theirs.items() if s.state == "success"},
            primary_items=fenced[0].items if fenced else {},
            shadow_items=fenced[1].items if fenced else {},
            shadow_rows=_captured_rows(shadow),
            primary_calls=fenced[0].calls if fenced else {},
            shadow_calls=_shadow_side(shadow).calls,
            primary_tasks={t: s.as_row() for t, s in primary.items()},
            shadow_tasks={t: s.as_row() for t, s in theirs.items()},
        ),
    )


def _fenced_sides(
    store: LeaseStore, spec: DagSpec, shadow: DagRunResult
) -> tuple[_Side, _Side] | None:
    """A whole-DAG shadow's fenced tasks (protected tasks of a DAG shadowed whole), each side:
    the primary's items and external calls from its leases and sink ledger, the shadow's
    captured. None when the DAG has none (an ordinary DAG: nothing to read there)."""
    tasks = tuple(t for t in spec.tasks if t.sink)
    if not tasks:
        return None
    primary = _primary_side(store, dataclasses.replace(spec, tasks=tasks), shadow)
    shadow_side = _shadow_side(shadow)
    names = {t.task_id for t in tasks}
    shadow_side.items = {t: i for t, i in shadow_side.items.items() if t in names}
    shadow_side.calls = {t: c for t, c in shadow_side.calls.items() if t in names}
    return primary, shadow_side


def record_primary(store: LeaseStore, result: DagRunResult) -> None:
    """Records a Temporal-primary run's side (no shadow to compare it with)."""
    with store.connection() as conn:
        conn.execute(
            query("comparison_insert_primary"),
            {
                "dag_id": result.dag_id,
                "business_date": keyed_date(result.business_date, result.partition_key),
                "primary_status": result.status,
                "primary_ms": result.duration_ms,
                "primary_digests": Jsonb(
                    {
                        t: digest(o.items or o.result)
                        for t, o in result.tasks.items()
                        if o.status == "succeeded"
                    }
                ),
            },
        )


def get_comparison(store: LeaseStore, dag_id: str, business_date: str) -> dict[str, Any] | None:
    """The stored comparison row of one business run, or None."""
    with store.connection() as conn:
        rows = conn.execute(
            query("comparison_get"), {"dag_id": dag_id, "business_date": business_date}
        ).fetchall()
    return rows[0] if rows else None


def recent(store: LeaseStore, dag_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """The DAG's latest compared runs, newest business date first."""
    with store.connection() as conn:
        return conn.execute(
            query("comparison_recent"), {"dag_id": dag_id, "limit": limit}
        ).fetchall()


@dataclasses.dataclass(frozen=True)
class Readiness:
    """Whether a DAG may cut over, and why not: what its last compared shadow runs say.

    Attributes:
        dag_id: the DAG.
        needed: consecutive matching runs needed (``BRIDGE_READY_AFTER``).
        compared: compared shadow runs among the last ``needed`` (fewer when fewer ran).
        last_diverging: the business date of the newest diverging run among them, if any.
        pending: the newest finished shadow whose comparison waits, and why (``waits``).
    """

    dag_id: str
    needed: int
    compared: int
    last_diverging: str | None = None
    pending: str | None = None

    @property
    def ready(self) -> bool:
        """True when the last ``needed`` compared runs all matched."""
        return self.compared >= self.needed and self.last_diverging is None

    def why_not(self) -> str:
        """What stands between the DAG and cutover, in a user's words ("" when ready)."""
        if self.ready:
            return ""
        why = self._why_not_compared()
        return f"{why}; {self.pending}" if self.pending else why

    def _why_not_compared(self) -> str:
        if self.last_diverging is not None:
            return (
                f"its shadow run of {self.last_diverging} diverged from Airflow's; it needs "
                f"{self.needed} matching shadow runs in a row after the last diverging one"
            )
        if self.compared == 0:
            return f"no shadow run has been compared yet; run {self.needed} in shadow first"
        return (
            f"{self.compared} of the {self.needed} shadow runs it needs have been compared "
            f"(all matched); run {self.needed - self.compared} more in shadow first"
        )


def readiness(store: LeaseStore, dag_id: str, runs: int) -> Readiness:
    """What the DAG's last ``runs`` compared business runs say about cutting over."""
    rows = recent(store, dag_id, runs)
    diverging = next((str(r["business_date"]) for r in rows if not r["matched"]), None)
    waiting = waits(store, dag_id)
    pending = (
        f"the comparison of {waiting[0]['business_date']} is pending: {waiting[0]['reason']}"
        if waiting
        else None
    )
    return Readiness(dag_id, runs, len(rows), diverging, pending)


def ready(store: LeaseStore, dag_id: str, runs: int) -> bool:
    """True when the DAG's last ``runs`` compared business runs all matched."""
    return readiness(store, dag_id, runs).ready


def _primary_key(shadow_key: str) -> str:
    return shadow_key.removesuffix(SHADOW_SUFFIX)


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"


def _primary_side(store: LeaseStore, spec: DagSpec, shadow: DagRunResult) -> _Side:
    keys: list[str] = []
    prefixes: list[str] = []
    for task in spec.tasks:
        base = (
            f"{spec.dag_id}/{task.task_id}/{keyed_date(shadow.business_date, shadow.partition_key)}"
        )
        outcome = shadow.tasks.get(task.task_id)
        if task.map_over:
            prefixes.append(_like_prefix(base))
        elif outcome is not None and outcome.keys:
            keys += [_primary_key(k) for k in outcome.keys]  # an item's own key, too
        else:
            keys.append(base)
    with store.connection() as conn:
        rows = conn.execute(query("lease_rows"), {"keys": keys, "prefixes": prefixes}).fetchall()
    by_task: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(row["key"].split("/")[1], []).append(row)
    side = _Side(status="success", ms=None, digests={}, items={})
    for task in spec.tasks:
        got = by_task.get(task.task_id, [])
        states = {r["state"] for r in got}
        if not got or "running" in states:
            side.waiting.append(task.task_id)
            side.status = "running" if got else "missing"
            continue
        if states != {"succeeded"}:
            side.status = "failed"
            continue
        if task.map_over:
            side.digests[task.task_id] = digest({r["key"].split("/")[3]: r["result"] for r in got})
        else:
            side.digests[task.task_id] = digest(got[0]["result"])
        if task.sink:
            side.items[task.task_id] = _ledger_items(task.sink, [r["key"] for r in got], task)
            calls = _external_calls(task.sink, [r["key"] for r in got])
            if calls:
                side.calls[task.task_id] = calls
    finished = [r["finished_at"] for r in rows if r["finished_at"] is not None]
    if rows and finished:
        start = min(r["acquired_at"] for r in rows)
        side.ms = round((max(finished) - start).total_seconds() * 1000)
    return side


def _ledger_items(sink: str, keys: list[str], task: Any) -> list[str]:
    with psycopg.connect(sink_dsn(sink, metastore=False), connect_timeout=10) as conn:
        rows = conn.execute(query("sink_ledger_items"), {"keys": keys}).fetchall()
    if task.map_over:
        return sorted(f"{k.split('/')[3]}/{i}" for k, i in rows)
    return sorted(str(i) for _, i in rows)


def _external_calls(sink: str, keys: list[str]) -> list[dict[str, Any]]:
    with psycopg.connect(sink_dsn(sink, metastore=False), connect_timeout=10) as conn:
        present = conn.execute(query("sink_has_external_calls")).fetchone()
        if not (present and present[0]):
            return []
        rows = conn.execute(query("sink_external_calls"), {"keys": keys}).fetchall()
    return [
        {"item": r[1], "idempotency_key": r[2], "params": r[3], "state": r[4], "reference": r[5]}
        for r in rows
    ]


def _call_set(calls: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """What a call would charge: the item, its idempotency key and its request's digest."""
    return {(c["item"], str(c["idempotency_key"]), digest(c["params"])) for c in calls}


def _shadow_side(shadow: DagRunResult) -> _Side:
    side = _Side(status=shadow.status, ms=shadow.duration_ms, digests={}, items={})
    for task_id, outcome in shadow.tasks.items():
        if outcome.status == "succeeded":
            # a mapped task by item, as the primary's lease rows are read
            side.digests[task_id] = digest(outcome.items or outcome.result)
        if "items" in outcome.captured:
            side.items[task_id] = sorted(outcome.captured["items"])
        if outcome.captured.get("calls"):
            side.calls[task_id] = list(outcome.captured["calls"])
    return side


def _differences(primary: _Side, shadow: _Side) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if primary.status != shadow.status:
        found.append({"what": "status", "primary": primary.status, "shadow": shadow.status})
    for task_id in sorted(set(primary.digests) | set(shadow.digests)):
        p, s = primary.digests.get(task_id), shadow.digests.get(task_id)
        if p != s:
            found.append({"what": "output", "task": task_id, "primary": p, "shadow": s})
    return found + _effect_differences(primary, shadow)


def _effect_differences(primary: _Side, shadow: _Side) -> list[dict[str, Any]]:
    """Where the two sides' effects differ: the sink items and the external calls, by task."""
    found: list[dict[str, Any]] = []
    for task_id in sorted(set(primary.items) | set(shadow.items)):
        p_items = set(primary.items.get(task_id, []))
        s_items = set(shadow.items.get(task_id, []))
        if p_items != s_items:
            found.append(
                {
                    "what": "sink_items",
                    "task": task_id,
                    "only_primary": sorted(p_items - s_items)[:MAX_LISTED],
                    "only_shadow": sorted(s_items - p_items)[:MAX_LISTED],
                }
            )
    for task_id in sorted(set(primary.calls) | set(shadow.calls)):
        p_calls = _call_set(primary.calls.get(task_id, []))
        s_calls = _call_set(shadow.calls.get(task_id, []))
        if p_calls != s_calls:
            found.append(
                {
                    "what": "external_calls",
                    "task": task_id,
                    "only_primary": sorted(c[0] for c in p_calls - s_calls)[:MAX_LISTED],
                    "only_shadow": sorted(c[0] for c in s_calls - p_calls)[:MAX_LISTED],
                }
            )
    return found
