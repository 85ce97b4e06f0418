"""The watcher: looks at every protected DAG on a fixed beat, apart from the schedulers.

Each look judges the runs every protected DAG (tagged, or with an exactly-once task) expected
over the lookback window. A run that becomes missed is reported once, at most one poll interval
after its deadline passes: an audit row (event ``missed_run``, so the audit page and a restarted
watcher know), the counter ``exactly_once.watcher.missed`` and the configured callback (route it
to paging). Open late and missed runs are gauges; a done run has its schedule lags exported
(``airflow_plugins.protection.sla``). ``Watcher.health`` and ``serve_health`` are its health
check.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.keys import lease_key
from airflow_plugins.protection import sla
from airflow_plugins.watcher.gaps import RunReport, RunStatus, WatchedDag
from airflow_plugins.watcher.reads import evaluate, reported_missed

log = logging.getLogger(__name__)

MISSED_METRIC = "exactly_once.watcher.missed"
# the pseudo-task under which the listener records DAG-run events
# (airflow_plugins.protection.listener)
RUN_TASK = "_dag_run"

MissedCallback = Callable[[RunReport], None]


def run_key(report: RunReport) -> str:
    """The audit key of a DAG run as a whole (``dag/_dag_run/period``)."""
    return str(lease_key(report.run.dag_id, RUN_TASK, report.run.business_date))


def load_callback(path: str) -> MissedCallback | None:
    """Imports ``module:function`` (None for an empty path)."""
    if not path:
        return None
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"watcher_callback {path!r} must be 'module:function'")
    found: MissedCallback = getattr(importlib.import_module(module), name)
    return found


@dataclasses.dataclass
class LookResult:
    """What one look found."""

    at: datetime
    reports: list[RunReport]
    newly_missed: list[RunReport]

    def count(self, status: RunStatus) -> int:
        """How many runs have ``status``."""
        return sum(1 for r in self.reports if r.status is status)


class Watcher:
    """Finds late and missed runs of protected DAGs and reports each missed run once.

    Args:
        store: the lease store (reads and the ``missed_run`` audit rows).
        dags: returns the watched DAGs (read again on every look, so new DAGs are picked up).
        lookback: how far back each look goes.
        on_missed: called once per newly missed run (exceptions are logged, never fatal).
        emit_metrics: export counters, gauges and lags through Airflow's metrics.
        clock: the current time (tests pass their own).
    """

    def __init__(
        self,
        store: LeaseStore,
        dags: Callable[[datetime], list[WatchedDag]],
        *,
        lookback: timedelta = timedelta(hours=48),
        on_missed: MissedCallback | None = None,
        emit_metrics: bool = True,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self._dags = dags
        self.lookback = lookback
        self.on_missed = on_missed
        self.emit_metrics = emit_metrics
        self._clock = clock
        self._reported: set[str] = set()
        self._measured: set[str] | None = None
        self.last_ok: datetime | None = None
        self.last_error: str | None = None

    def look(self) -> LookResult:
        """Judges every watched DAG once; reports newly missed runs."""
        now = self._clock()
        reports: list[RunReport] = []
        newly: list[RunReport] = []
        for dag in self._dags(now):
            with self.store.connection() as conn:
                found = evaluate(conn, dag, now - self.lookback, now, now)
                missed = [r for r in found if r.status is RunStatus.MISSED]
                already = reported_missed(conn, dag.dag_id, [r.run for r in missed])
            for report in missed:
                key = run_key(report)
                if key not in already and key not in self._reported:
                    newly.append(report)
                self._reported.add(key)
            reports.extend(found)
        for report in newly:
            self._report_missed(report)
        self._measure(reports)
        self.last_ok = now
        self.last_error = None
        return LookResult(now, reports, newly)

    def _report_missed(self, report: RunReport) -> None:
        run = report.run
        self.store.record_event(
            run_key(report),
            "missed_run",
            outcome="missed",
            input={"scheduled_at": run.scheduled_at.isoformat(), "missing": report.missing_tasks},
            reason=f"not done by its deadline {run.deadline.isoformat()}",
            actor="watcher",
        )
        log.error(
            "missed run %s %s (scheduled %s, deadline %s, missing %s)",
            run.dag_id,
            run.business_date,
            run.scheduled_at,
            run.deadline,
            ", ".join(report.missing_tasks),
        )
        if self.emit_metrics:
            sla._stats().incr(MISSED_METRIC, tags={"dag_id": run.dag_id})
        if self.on_missed is not None:
            try:
                self.on_missed(report)
            except Exception:
                log.exception("the missed-run callback failed for %s", run_key(report))

    def _measure(self, reports: list[RunReport]) -> None:
        done = {run_key(r): r for r in reports if r.status is RunStatus.DONE}
        if self._measured is None:
            # runs done before this watcher started were measured by its predecessor
            self._measured = set(done)
            return
        for key, report in done.items():
            if key in self._measured:
                continue
            self._measured.add(key)
            if self.emit_metrics:
                sla.export_run_lag(report.run.dag_id, report.start_lag, report.finish_lag)
        if self.emit_metrics:
            stats = sla._stats()
            for status in (RunStatus.LATE, RunStatus.MISSED):
                open_runs = sum(1 for r in reports if r.status is status)
                stats.gauge(f"exactly_once.watcher.{status.value}_open", open_runs)

    def run_forever(self, poll: float, stop: threading.Event, health_file: str = "") -> None:
        """Looks every ``poll`` seconds until ``stop`` is set; a failed look is logged, retried."""
        while not stop.is_set():
            try:
                result = self.look()
                if health_file:
                    Path(health_file).write_text(result.at.isoformat())
            except Exception as exc:
                self.last_error = str(exc)
                log.exception("watcher look failed")
            stop.wait(poll)

    def health(self, poll: float) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of the health check.

        200 while looks succeed, 503 when the last good look is older than three poll intervals
        (the lease store or the metadata database is unreachable). The body says only ok or
        stale and when the last good look was: why a look failed (an error naming hosts and
        users) goes to the log only, since the endpoint is unauthenticated.
        """
        now = self._clock()
        fresh = self.last_ok is not None and now - self.last_ok <= timedelta(seconds=3 * poll)
        body = {
            "status": "ok" if fresh else "stale",
            "last_ok": self.last_ok.isoformat() if self.last_ok else None,
        }
        return (200 if fresh else 503), body


def serve_health(
    watcher: Watcher, poll: float, port: int, host: str = "127.0.0.1"
) -> ThreadingHTTPServer:
    """Starts the ``/health`` endpoint in a daemon thread; returns the server (to shut down).

    ``host`` is where it listens: the loopback by default, since anyone reaching it may ask.
    The optional health file is touched after every good look (``Watcher.run_forever``).
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/health":
                self.send_error(404)
                return
            code, body = watcher.health(poll)
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="watcher-health", daemon=True).start()
    return server
