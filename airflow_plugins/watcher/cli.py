"""``exactly-once-watcher``: run the watcher, list gaps over any period, check its health.

    exactly-once-watcher run                      # the long-running watcher (one per cluster)
    exactly-once-watcher gaps --since 2024-01-01 --until 2024-12-31 [--dag billing_nightly]
    exactly-once-watcher health                   # exit 0 when the watcher's /health is ok

``gaps`` prints one line per late or missed run and, last, one JSON object with the counts.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from airflow_plugins.lease import LeaseStore
from airflow_plugins.watcher import settings
from airflow_plugins.watcher.gaps import RunStatus


def _moment(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _run(_: argparse.Namespace) -> int:
    from airflow_plugins.protection import sla
    from airflow_plugins.watcher.dags import protected_dags
    from airflow_plugins.watcher.service import Watcher, load_callback, serve_health

    sla.initialise_metrics()
    poll = settings.poll_seconds()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with LeaseStore(settings.lease_store_dsn()) as store:
        watcher = Watcher(
            store,
            protected_dags,
            lookback=settings.lookback(),
            on_missed=load_callback(settings.callback_path()),
        )
        server = None
        if settings.health_port():
            server = serve_health(
                watcher, poll, settings.health_port(), host=settings.health_host()
            )
        print(f"watcher: looking every {poll:.0f} s", flush=True)
        try:
            watcher.run_forever(poll, stop, settings.health_file())
        finally:
            if server is not None:
                server.shutdown()
    return 0


def _gaps(args: argparse.Namespace) -> int:
    from airflow_plugins.watcher.dags import protected_dags
    from airflow_plugins.watcher.reads import evaluate

    now = datetime.now(UTC)
    until = _moment(args.until) if args.until else now
    since = _moment(args.since) if args.since else until - timedelta(days=1)
    counts = {status.value: 0 for status in RunStatus}
    with LeaseStore(settings.lease_store_dsn()) as store, store.connection() as conn:
        for dag in protected_dags(now):
            if args.dag and dag.dag_id not in args.dag:
                continue
            for report in evaluate(conn, dag, since, until, now, lags=False):
                counts[report.status.value] += 1
                if report.is_gap or args.all:
                    print(
                        f"{report.status.value:8} {dag.dag_id} {report.run.business_date} "
                        f"scheduled {report.run.scheduled_at.isoformat()} "
                        f"deadline {report.run.deadline.isoformat()} "
                        f"missing {','.join(report.missing_tasks) or '-'}"
                    )
    print(json.dumps({"since": since.isoformat(), "until": until.isoformat(), **counts}))
    return 1 if counts["missed"] and args.fail_on_missed else 0


def _health(args: argparse.Namespace) -> int:
    url = args.url or f"http://127.0.0.1:{settings.health_port()}/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            print(answer.read().decode())
            return 0
    except (urllib.error.URLError, OSError) as exc:
        print(f"watcher unhealthy: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``exactly-once-watcher``."""
    parser = argparse.ArgumentParser(prog="exactly-once-watcher", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the watcher until SIGTERM").set_defaults(func=_run)
    gaps = sub.add_parser("gaps", help="list late and missed runs over a period")
    gaps.add_argument("--since", help="ISO date/time (default: a day before --until)")
    gaps.add_argument("--until", help="ISO date/time (default: now)")
    gaps.add_argument("--dag", action="append", help="only this DAG (repeatable)")
    gaps.add_argument("--all", action="store_true", help="list done and upcoming runs too")
    gaps.add_argument("--fail-on-missed", action="store_true", help="exit 1 when any is missed")
    gaps.set_defaults(func=_gaps)
    health = sub.add_parser("health", help="exit 0 when the watcher is healthy")
    health.add_argument("--url", help="the /health URL (default: the configured port)")
    health.set_defaults(func=_health)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
