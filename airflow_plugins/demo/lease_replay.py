"""The incident, replayed at the lease level with real processes and a real Postgres.

Two OS processes play the two executions of the 2024-02-15 billing run: the first charges
customers until it is frozen (SIGSTOP, as a scheduler evicted mid-run leaves its task behind),
the second starts once the first looks dead (its lease expired), then the first is resumed
(SIGCONT) and carries on. The replay runs twice: once without fencing (what Airflow does
today) and once with the run-lease and the sink fence. The charges are counted in the billing
database each time.

    exactly-once-demo                 # embedded PostgreSQL, started and removed by the demo
    exactly-once-demo --dsn URL       # a server you name (it creates and drops two databases)

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import sql

from airflow_plugins.lease import (
    SINK_FENCE,
    Holder,
    LeaseError,
    LeaseKeeper,
    LeaseLost,
    LeaseStore,
    advance_fence,
    fenced_transaction,
    migrate,
)

RUN_KEY = "billing_nightly/charge/2024-02-15"
DSN_ENV = "EXACTLY_ONCE_DEMO_DSN"


# -- the worker: one execution of the billing run, in its own process ----------------------------


def _customers(count: int) -> list[str]:
    return [f"cus_{i:04d}" for i in range(1, count + 1)]


def _charge(conn: psycopg.Connection[Any], customer: str, token: int | None, name: str) -> None:
    conn.execute(
        "INSERT INTO charges (run_key, customer, amount_cents, token, writer) "
        "VALUES (%s, %s, %s, %s, %s)",
        (RUN_KEY, customer, 2412_00, token, name),
    )


def _work_plain(args: argparse.Namespace) -> dict[str, Any]:
    """Today's behaviour: every execution charges every customer it is given."""
    charged = 0
    with psycopg.connect(args.sink, autocommit=True) as conn:
        for customer in _customers(args.customers):
            _charge(conn, customer, None, args.name)
            charged += 1
            time.sleep(args.delay)
    return {"charged": charged, "refused": 0}


def _work_fenced(args: argparse.Namespace) -> dict[str, Any]:
    """With the plugin: take the run-lease, then charge each customer in a fenced transaction."""
    holder = Holder.process(args.name)
    with LeaseStore(args.leases, ttl=args.ttl) as store:
        got = store.acquire(RUN_KEY, holder, input={"customers": args.customers})
        if not got.granted:
            return {"charged": 0, "refused": 0, "outcome": str(got.outcome)}
        lease = got.lease
        with psycopg.connect(args.sink) as conn:
            advance_fence(conn, RUN_KEY, lease.token)  # older holders are refused from now on
        charged = refused = 0
        with LeaseKeeper(store, lease, interval=args.ttl / 4) as keeper:
            for customer in _customers(args.customers):
                try:
                    keeper.check()
                    with (
                        psycopg.connect(args.sink) as conn,
                        fenced_transaction(conn, RUN_KEY, lease.token, idle_timeout=1.0) as tx,
                    ):
                        if tx.claim(customer):
                            _charge(conn, customer, lease.token, args.name)
                            charged += 1
                except (LeaseError, psycopg.Error) as exc:
                    # superseded (StaleToken, LeaseLost), or its session ended while it was
                    # frozen: every further write would be refused too, so stop here
                    refused += 1
                    print(
                        f"{args.name}: write refused: {type(exc).__name__}: {exc}", file=sys.stderr
                    )
                    break
                time.sleep(args.delay)
        if not keeper.lost and not refused:
            try:
                store.complete(lease, {"charged": charged})
            except LeaseLost as exc:  # taken over after its last write: the next holder ends it
                print(f"{args.name}: not completed: {exc}", file=sys.stderr)
    return {
        "charged": charged,
        "refused": refused,
        "outcome": str(got.outcome),
        "token": lease.token,
    }


def _worker(args: argparse.Namespace) -> int:
    result = _work_fenced(args) if args.fenced else _work_plain(args)
    print(json.dumps(result))
    return 0


# -- the replay ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    """An admin DSN: the one given, else an embedded server started (and removed) here."""
    if dsn:
        yield dsn
        return
    from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres

    port = _free_port()
    datadir = Path(tempfile.mkdtemp(prefix="exactly-once-demo-")) / "pg"
    print(f"starting an embedded PostgreSQL on 127.0.0.1:{port} ...", flush=True)
    with EmbeddedPostgres(port, datadir=datadir, settings={"fsync": "off"}) as pg:
        yield pg.dsn()


@contextlib.contextmanager
def _databases(admin: str) -> Iterator[tuple[str, str]]:
    names = [f"demo_leases_{uuid.uuid4().hex[:8]}", f"demo_billing_{uuid.uuid4().hex[:8]}"]
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    leases, sink = (psycopg.conninfo.make_conninfo(admin, dbname=n) for n in names)
    try:
        yield leases, sink
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in names:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def _start_worker(
    name: str, fenced: bool, leases: str, sink: str, opts: argparse.Namespace
) -> _Worker:
    argv = [
        sys.executable,
        "-m",
        "airflow_plugins.demo.lease_replay",
        "worker",
        "--name",
        name,
        "--leases",
        leases,
        "--sink",
        sink,
        "--customers",
        str(opts.customers),
        "--delay",
        str(opts.delay),
        "--ttl",
        str(opts.ttl),
    ]
    if fenced:
        argv.append("--fenced")
    # its stderr (refusals, or what made it fail) goes to a file of its own, read by _result
    errors = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
    return _Worker(name, proc, errors)


@dataclasses.dataclass
class _Worker:
    """One execution's process and its stderr."""

    name: str
    proc: subprocess.Popen[str]
    errors: IO[str]

    def result(self, out: str) -> dict[str, Any]:
        """What it printed last (its JSON result); closes its stderr.

        Raises:
            RuntimeError: it printed none (it failed), with the end of its stderr.
        """
        self.errors.seek(0)
        errors = self.errors.read()
        self.errors.close()
        lines = out.strip().splitlines()
        if self.proc.returncode == 0 and lines:
            result: dict[str, Any] = json.loads(lines[-1])
            return result
        raise RuntimeError(f"{self.name} failed (exit {self.proc.returncode}):\n{errors[-2000:]}")


def _count(sink: str, query: str) -> int:
    with psycopg.connect(sink) as conn:
        row = conn.execute(query).fetchone()
        return int(row[0]) if row else 0


def _replay(fenced: bool, leases: str, sink: str, opts: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(sink, autocommit=True) as conn:
        conn.execute("TRUNCATE charges")
        conn.execute("TRUNCATE runfence.fence, runfence.ledger")
    first = _start_worker("execution-1 (evicted scheduler's task)", fenced, leases, sink, opts)
    try:
        deadline = time.monotonic() + 120
        while _count(sink, "SELECT count(*) FROM charges") < opts.freeze_after:
            if first.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the first execution stopped before it could be frozen")
            time.sleep(0.02)
        os.kill(first.proc.pid, signal.SIGSTOP)
        # the standby sees the run as unfinished once the lease has expired
        time.sleep(opts.ttl + 1.0)
        second = _start_worker("execution-2 (standby's re-run)", fenced, leases, sink, opts)
        second_out, _ = second.proc.communicate(timeout=600)
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    first_out, _ = first.proc.communicate(timeout=600)
    charges = _count(sink, "SELECT count(*) FROM charges")
    twice = _count(
        sink,
        "SELECT count(*) FROM (SELECT customer FROM charges GROUP BY customer "
        "HAVING count(*) > 1) d",
    )
    charged = _count(sink, "SELECT count(DISTINCT customer) FROM charges")
    return {
        "charges": charges,
        "customers_charged": charged,
        "customers_charged_twice": twice,
        "customers_missed": opts.customers - charged,
        "execution_1": first.result(first_out),
        "execution_2": second.result(second_out),
    }


def _prepare(leases: str, sink: str) -> None:
    migrate(leases)
    migrate(sink, SINK_FENCE)
    with psycopg.connect(sink, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, run_key text NOT NULL,"
            " customer text NOT NULL, amount_cents bigint NOT NULL, token bigint, writer text,"
            " charged_at timestamptz NOT NULL DEFAULT now())"
        )


def _report(plain: dict[str, Any], fenced: dict[str, Any], customers: int) -> dict[str, Any]:
    rows = [
        ("charges written", plain["charges"], fenced["charges"]),
        ("customers charged", plain["customers_charged"], fenced["customers_charged"]),
        (
            "customers charged twice",
            plain["customers_charged_twice"],
            fenced["customers_charged_twice"],
        ),
        ("customers missed", plain["customers_missed"], fenced["customers_missed"]),
        ("writes refused by the fence", 0, fenced["execution_1"]["refused"]),
    ]
    print()
    print(f"Billing run {RUN_KEY}, {customers} customers; execution 1 frozen mid-run,")
    print("execution 2 started after its lease expired, execution 1 resumed afterwards.")
    print()
    print(f"{'':32}{'without fencing':>18}{'with lease + fence':>22}")
    for label, a, b in rows:
        print(f"{label:32}{a:>18}{b:>22}")
    print()
    return {
        "run_key": RUN_KEY,
        "customers": customers,
        "without_fencing": {
            k: plain[k]
            for k in ("charges", "customers_charged", "customers_charged_twice", "customers_missed")
        },
        "with_fencing": {
            **{
                k: fenced[k]
                for k in (
                    "charges",
                    "customers_charged",
                    "customers_charged_twice",
                    "customers_missed",
                )
            },
            "writes_refused": fenced["execution_1"]["refused"],
            "takeover_token": fenced["execution_2"].get("token"),
        },
        "blocked": fenced["customers_charged_twice"] == 0 and fenced["customers_missed"] == 0,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactly-once-demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV),
        help=f"admin DSN of a PostgreSQL server (${DSN_ENV}); default: embedded",
    )
    parser.add_argument("--customers", type=int, default=340)
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per charge")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease TTL in seconds")
    parser.add_argument(
        "--freeze-after", type=int, default=100, help="charges before execution 1 is frozen"
    )
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker", help=argparse.SUPPRESS)
    worker.add_argument("--name", required=True)
    worker.add_argument("--leases", required=True)
    worker.add_argument("--sink", required=True)
    worker.add_argument("--fenced", action="store_true")
    worker.add_argument("--customers", type=int, default=340)
    worker.add_argument("--delay", type=float, default=0.01)
    worker.add_argument("--ttl", type=float, default=2.0)
    return parser


def run(argv: list[str] | None = None) -> int:
    """Runs the replay (or, with ``worker``, one execution); returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "worker":
        return _worker(args)
    if not 0 < args.freeze_after < args.customers:
        print("--freeze-after must be between 0 and --customers", file=sys.stderr)
        return 2
    with _server(args.dsn) as admin, _databases(admin) as (leases, sink):
        _prepare(leases, sink)
        plain = _replay(False, leases, sink, args)
        fenced = _replay(True, leases, sink, args)
        summary = _report(plain, fenced, args.customers)
    print(json.dumps(summary))
    return 0 if summary["blocked"] else 1


def main() -> None:
    """Console entry point."""
    sys.exit(run())


if __name__ == "__main__":
    main()
