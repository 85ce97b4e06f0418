"""``runlease``: the operators' command line for the lease store and sink fences.

    runlease migrate [--sink DSN ...]
    runlease leases [--live | --expired | --taken-over | --refused | --blocked] [--prefix P]
    runlease history KEY
    runlease force-release KEY --reason "..."
    runlease override KEY --reason "..." [--business-date 2024-02-15]
    runlease maintain [--prune]
    runlease agent [--socket PATH] [--workers 8] [--no-prepare] [--mode 600] [--status]
                   [--horizon-days 400]

The lease store is named by ``--dsn`` or the ``EXACTLY_ONCE_LEASE_DSN`` environment variable
(``agent`` also reads the plugin's ``[exactly_once]`` options when Airflow is installed).
``--dsn`` and ``--json`` go before or after the subcommand. Administrative changes record the
actor (``--actor``, default the login name) and the reason. Exit codes: 0 done, 1 refused or
failed, 2 usage or configuration, 3 the lease store unreachable (see ``command_line``).
"""

from __future__ import annotations

import argparse
import getpass
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

import psycopg

from airflow_plugins.lease.command_line import (
    EXIT_CODES,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CommandParser,
    add_global_options,
    fail,
)
from airflow_plugins.lease.errors import LeaseError, LeaseStoreUnavailable
from airflow_plugins.lease.migrations import LEASE_STORE, SINK_FENCE, migrate
from airflow_plugins.lease.queries import query
from airflow_plugins.lease.store import LeaseStore

DSN_ENV = "EXACTLY_ONCE_LEASE_DSN"
_LIST_COLUMNS = ("key", "state", "token", "attempt", "takeovers", "expires_at", "holder")
_HISTORY_COLUMNS = ("at", "event", "outcome", "token", "attempt", "duration_ms", "actor", "reason")


KEY_EXAMPLE = "billing_nightly/charge/2024-02-15"
EXAMPLES = {
    "migrate": "runlease migrate --dsn postgresql://runlease@leases-db/leases "
    "--sink postgresql://billing@billing-db/billing",
    "leases": "runlease leases --live --prefix billing_nightly/ --json",
    "history": f"runlease history {KEY_EXAMPLE} --json",
    "force-release": f'runlease force-release {KEY_EXAMPLE} --reason "holder host lost"',
    "override": f'runlease override {KEY_EXAMPLE} --reason "re-bill after refund fix"',
    "maintain": "runlease maintain --prune --horizon-days 400 --audit-keep-months 14",
    "agent": "runlease agent --socket /run/runlease/agent.sock",
}


def _epilog(*names: str) -> str:
    lines = "\n".join(f"  {EXAMPLES[n]}" for n in names)
    return f"examples:\n{lines}\n\n{EXIT_CODES}"


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="runlease", description=__doc__.split("\n\n")[0], epilog=_epilog(*EXAMPLES)
    )
    dsn_help = f"lease store (${DSN_ENV})"
    add_global_options(parser, top=True, dsn_default=os.environ.get(DSN_ENV), dsn_help=dsn_help)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        made = sub.add_parser(name, help=text, description=text, epilog=_epilog(name))
        add_global_options(made, top=False, dsn_help=dsn_help)
        return made

    m = command("migrate", "create or upgrade the lease store and sink fence tables")
    m.add_argument("--sink", action="append", default=[], help="a sink database to fence")

    ls = command("leases", "list leases")
    which = ls.add_mutually_exclusive_group()
    which.add_argument("--live", action="store_true", help="running leases")
    which.add_argument("--expired", action="store_true", help="running but past expiry")
    which.add_argument("--taken-over", action="store_true", help="leases taken over")
    which.add_argument("--refused", action="store_true", help="refused acquires (audit)")
    which.add_argument("--blocked", action="store_true", help="blocked duplicates (audit)")
    ls.add_argument("--state", choices=["running", "succeeded", "failed", "released"])
    ls.add_argument("--prefix", help="keys starting with this")
    ls.add_argument("--hours", type=int, default=24, help="audit window for --refused/--blocked")
    ls.add_argument("--limit", type=int, default=100)

    h = command("history", "a key's audit trail")
    h.add_argument("key")

    for name, text in (
        ("force-release", "release a running lease whoever holds it"),
        ("override", "approve one more run of a succeeded (or pruned) key"),
    ):
        admin = command(name, text)
        admin.add_argument("key")
        admin.add_argument("--reason", required=True, help="why (recorded in the audit)")
        admin.add_argument("--actor", default=_login(), help="who (default: login name)")
        if name == "override":
            admin.add_argument("--business-date", type=date.fromisoformat)

    mt = command("maintain", "create audit partitions ahead; optionally prune")
    mt.add_argument("--months-ahead", type=int, default=3)
    mt.add_argument("--prune", action="store_true", help="drop old audit months and leases")
    mt.add_argument("--horizon-days", type=int, default=400)
    mt.add_argument("--audit-keep-months", type=int, default=14)
    ag = command("agent", "serve protected tries' lease statements on a socket")
    ag.add_argument("--socket", help="Unix socket (default: [exactly_once] agent_socket)")
    ag.add_argument("--workers", type=int, default=8, help="requests served at once")
    ag.add_argument(
        "--no-prepare",
        dest="prepare",
        action="store_false",
        help="prepare nothing on the server (behind a transaction pooler before PgBouncer 1.21)",
    )
    ag.add_argument(
        "--mode", type=lambda text: int(text, 8), default=0o600, help="socket permissions (octal)"
    )
    ag.add_argument(
        "--horizon-days",
        type=int,
        default=400,
        help="widest retention horizon a request may ask for ([exactly_once] horizon_days)",
    )
    ag.add_argument(
        "--status",
        action="store_true",
        help="ask the agent on the socket instead: print its status; exit 3 if none answers",
    )
    return parser


def _host_defaults(have_dsn: bool) -> tuple[str | None, str | None]:
    """The lease store DSN and agent socket a host (the Airflow plugin) configures, if any.

    A host registers a callable in the ``runlease.defaults`` entry-point group, so this core
    reads the plugin's ``[exactly_once]`` options without importing the plugin.
    """
    dsn: str | None = None
    path: str | None = None
    for entry in importlib.metadata.entry_points(group="runlease.defaults"):
        host_dsn, host_path = entry.load()(have_dsn)
        dsn, path = dsn or host_dsn, path or host_path
    return dsn, path


def _agent(args: argparse.Namespace) -> int:
    import logging

    from airflow_plugins.lease import agent

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    dsn, path = args.dsn, args.socket
    if not dsn or not path:
        try:
            default_dsn, default_path = _host_defaults(bool(dsn))
        except LeaseError as exc:
            return fail("runlease agent", exc, EXIT_USAGE)
        dsn, path = dsn or default_dsn, path or default_path
    if not dsn or not path:
        return fail(
            "runlease agent",
            f"name the lease store (--dsn, ${DSN_ENV} or [exactly_once]) and "
            "the socket (--socket or [exactly_once] agent_socket)",
            EXIT_USAGE,
        )
    if args.status:
        from airflow_plugins.lease.agent_client import AgentClient

        status = AgentClient(path, dsn, timeout=10).status()
        print(json.dumps(status if status is not None else {"socket": path, "answers": False}))
        return 0 if status is not None else EXIT_UNREACHABLE
    return agent.run(
        dsn,
        path,
        workers=args.workers,
        prepare=args.prepare,
        mode=args.mode,
        horizon_days=args.horizon_days,
    )


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _cell(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else str(value)


def _print(rows: Sequence[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row, default=str, sort_keys=True))
        return
    table = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in table]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in table:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))


def _leases(store: LeaseStore, args: argparse.Namespace) -> None:
    if args.refused or args.blocked:
        outcomes = ["refused"] if args.refused else ["held"]
        rows = store.recent_outcomes(
            outcomes, hours=args.hours, prefix=args.prefix, limit=args.limit
        )
        _print(rows, ("at", "key", "outcome", "token", "holder", "reason"), args.json)
        return
    rows = store.list_leases(
        prefix=args.prefix,
        state="running" if args.live or args.expired else args.state,
        expired_only=args.expired,
        taken_over_only=args.taken_over,
        limit=args.limit,
    )
    _print(rows, _LIST_COLUMNS, args.json)


def _maintain(store: LeaseStore, args: argparse.Namespace) -> None:
    today = date.today()
    until = today + timedelta(days=31 * args.months_ahead)
    with store.connection() as conn:
        made = conn.execute(
            query("ensure_audit_partitions"), {"from": today, "until": until}
        ).fetchone()
        result: dict[str, Any] = {"partitions_created": made and next(iter(made.values()))}
        if args.prune:
            pruned = conn.execute(
                query("prune"),
                {"horizon_days": args.horizon_days, "audit_keep_months": args.audit_keep_months},
            ).fetchone()
            result.update(pruned or {})
    print(json.dumps(result))


def _command(args: argparse.Namespace) -> int:
    if args.command == "migrate":
        if args.dsn:
            print(json.dumps({"lease_store": migrate(args.dsn, LEASE_STORE)}))
        for sink in args.sink:
            print(json.dumps({"sink": migrate(sink, SINK_FENCE)}))
        return 0
    with LeaseStore(args.dsn) as store:
        if args.command == "leases":
            _leases(store, args)
        elif args.command == "history":
            _print(store.history(args.key), _HISTORY_COLUMNS, args.json)
        elif args.command == "force-release":
            token = store.force_release(args.key, actor=args.actor, reason=args.reason)
            if args.json:
                print(json.dumps({"key": args.key, "released_token": token}))
            else:
                print(f"released token {token}" if token else "no running lease: nothing to do")
        elif args.command == "override":
            approved = store.approve_rerun(
                args.key, actor=args.actor, reason=args.reason, business_date=args.business_date
            )
            print(json.dumps({"key": args.key, "override": approved}) if args.json else approved)
        elif args.command == "maintain":
            _maintain(store, args)
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code (see ``command_line``)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "agent":
            return _agent(args)
        if not args.dsn and not (args.command == "migrate" and args.sink):
            return fail("runlease", f"name the lease store with --dsn or ${DSN_ENV}", EXIT_USAGE)
        return _command(args)
    except (LeaseStoreUnavailable, psycopg.OperationalError) as exc:
        return fail("runlease", exc, EXIT_UNREACHABLE)
    except (LeaseError, psycopg.Error, ValueError) as exc:
        return fail("runlease", exc, EXIT_REFUSED)
    except KeyboardInterrupt:
        return fail("runlease", "interrupted", EXIT_REFUSED)


def main() -> None:
    """Console entry point."""
    sys.exit(run())
