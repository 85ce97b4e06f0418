"""A billing holder for the fault-injection tests (run as a script: a real OS process).

It takes the lease of one billing run, keeps it renewed, advances the sink's fence, then charges
customers into the sink's ``charges`` table one per fenced transaction, skipping customers the
ledger says are done, and completes the lease. It prints one JSON event per line (flushed), so
the test can follow it: started, waiting, granted, charged, paused, commit_failed, stale, lost,
completed, succeeded, unavailable.

Exit codes: 0 done (or already done), 3 store unavailable (without --retry), 5 refused by the
sink fence (stale token), 6 lease lost (stopped cleanly), 7 could not reach the sink in time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

import psycopg

from airflow_plugins.lease import (
    Holder,
    Lease,
    LeaseKeeper,
    LeaseLost,
    LeaseStore,
    LeaseStoreUnavailable,
    Outcome,
    StaleToken,
    advance_fence,
    fenced_transaction,
)

CHARGE = "INSERT INTO charges (run_key, customer, token, writer) VALUES (%s, %s, %s, %s)"


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed at once (the test reads it while we run)."""
    print(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}), flush=True)


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lease-dsn", required=True)
    parser.add_argument("--sink-dsn", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--customers", type=int, default=60)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--item-sleep", type=float, default=0.05)
    parser.add_argument("--idle-timeout", type=float, default=10.0)
    parser.add_argument("--pause-at", type=int, default=-1, help="SIGSTOP itself before commit")
    parser.add_argument("--retry", action="store_true", help="ride out an unavailable Postgres")
    parser.add_argument("--deadline", type=float, default=120.0)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _args(argv)
    emit("started", name=args.name)
    with LeaseStore(args.lease_dsn, ttl=args.ttl, connect_timeout=1.0, pool_size=2) as store:
        lease = _acquire(store, args)
        if isinstance(lease, int):
            return lease
        emit("granted", token=lease.token, attempt=lease.attempt)
        try:
            with LeaseKeeper(store, lease) as keeper:
                charged = _charge(args, lease, keeper)
            _complete(store, lease, args, {"charged": charged, "by": args.name})
        except StaleToken as exc:
            emit("stale", token=lease.token, current=exc.current)
            return 5
        except LeaseLost as exc:
            emit("lost", token=lease.token, detail=str(exc))
            return 6
        except TimeoutError as exc:
            emit("gave_up", detail=str(exc))
            return 7
    emit("completed", token=lease.token, charged=charged)
    return 0


def _acquire(store: LeaseStore, args: argparse.Namespace) -> Lease | int:
    deadline = time.monotonic() + args.deadline
    while time.monotonic() < deadline:
        try:
            got = store.acquire(args.key, Holder.process(args.name), input={"n": args.customers})
        except LeaseStoreUnavailable as exc:
            emit("unavailable", during="acquire", detail=str(exc)[:200])
            if not args.retry:
                return 3
            time.sleep(0.2)
            continue
        if got.outcome is Outcome.SUCCEEDED:
            emit("succeeded", result=got.result)
            return 0
        if got.granted:
            return got.lease
        emit("waiting", outcome=str(got.outcome), token=got.token)
        time.sleep(0.1)
    emit("gave_up", during="acquire")
    return 7


def _sink(args: argparse.Namespace, deadline: float) -> psycopg.Connection[Any]:
    while True:
        try:
            return psycopg.connect(args.sink_dsn, autocommit=True, connect_timeout=2)
        except psycopg.OperationalError as exc:
            emit("unavailable", during="sink connect", detail=str(exc)[:200])
            if not args.retry or time.monotonic() > deadline:
                raise TimeoutError("sink unreachable") from exc
            time.sleep(0.2)


def _charge(args: argparse.Namespace, lease: Lease, keeper: LeaseKeeper) -> int:
    deadline = time.monotonic() + args.deadline
    conn = _sink(args, deadline)
    charged = 0
    i = -1
    fenced = False
    while i + 1 < args.customers:
        keeper.check()
        customer = f"customer-{i + 1:03d}"
        try:
            if not fenced:
                # a new holder raises the fence before any work: older tokens are refused
                advance_fence(conn, lease.key, lease.token)
                fenced = True
            wrote = _charge_one(conn, args, lease, customer, i + 1)
        except (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout) as exc:
            # the commit's fate is unknown: reconnect and redo the same customer; the ledger
            # says whether it was done
            emit("commit_failed", customer=customer, detail=str(exc)[:200])
            conn.close()
            if not args.retry and args.pause_at < 0:
                raise
            conn = _sink(args, deadline)
            continue
        i += 1
        charged += wrote
        emit("charged" if wrote else "skipped", customer=customer, token=lease.token)
        time.sleep(args.item_sleep)
    conn.close()
    return charged


def _charge_one(
    conn: psycopg.Connection[Any], args: argparse.Namespace, lease: Lease, customer: str, i: int
) -> int:
    with fenced_transaction(conn, lease.key, lease.token, idle_timeout=args.idle_timeout) as tx:
        if not tx.claim(customer):
            return 0
        conn.execute(CHARGE, (lease.key, customer, lease.token, args.name))
        if i == args.pause_at:
            # past the fence check, before the commit: stop here until the test says SIGCONT
            emit("paused", customer=customer, token=lease.token)
            os.kill(os.getpid(), signal.SIGSTOP)
            emit("resumed", customer=customer)
    return 1


def _complete(
    store: LeaseStore, lease: Lease, args: argparse.Namespace, result: dict[str, Any]
) -> None:
    deadline = time.monotonic() + args.deadline
    while True:
        try:
            store.complete(lease, result)
            return
        except LeaseStoreUnavailable as exc:
            emit("unavailable", during="complete", detail=str(exc)[:200])
            if not args.retry or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
