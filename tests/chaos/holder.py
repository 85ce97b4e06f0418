"""One holder of the campaign (run as a script: a real OS process the campaign can kill).

Fenced mode takes the key's lease through the public API, keeps it renewed, and writes each
item in its own fenced transaction (skipping items the ledger has), then completes the lease;
it retries through store and sink errors. Plain mode is the plugin disabled: it writes every
item it is given, no lease, no fence. It prints one JSON line per event (granted, wrote,
completed, succeeded) so the campaign knows when a lease or a sink transaction is live.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import psycopg

from airflow_plugins.lease import (
    Holder,
    LeaseError,
    LeaseKeeper,
    LeaseStore,
    Outcome,
    StaleToken,
    fenced_transaction,
)

WRITE = "INSERT INTO effects (key, item, token, writer) VALUES (%s, %s, %s, %s)"


def emit(event: str, **fields: Any) -> None:
    """One JSON line, flushed (the campaign reads it while the holder runs)."""
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def _plain(args: argparse.Namespace) -> int:
    with psycopg.connect(args.sink_dsn, autocommit=True, application_name=args.name[-63:]) as conn:
        emit("granted", token=0)
        for n in range(args.items):
            conn.execute(WRITE, (args.key, f"item-{n:03d}", 0, args.name))
            emit("wrote", item=n)
            time.sleep(args.item_sleep)
    emit("completed")
    return 0


def _fenced_once(store: LeaseStore, args: argparse.Namespace) -> bool:
    """One lease's worth of work; True once the key is done."""
    got = store.acquire(args.key, Holder.process(args.name))
    if got.outcome is Outcome.SUCCEEDED:
        emit("succeeded")
        return True
    if not got.granted:
        time.sleep(0.1)
        return False
    lease = got.lease
    emit("granted", token=lease.token)
    # named, so the campaign can find and cut this holder's sink session
    sink = {"conninfo": args.sink_dsn, "application_name": args.name[-63:]}
    with LeaseKeeper(store, lease) as keeper, psycopg.connect(**sink) as conn:
        n = 0
        while n < args.items:
            keeper.check()
            item = f"item-{n:03d}"
            try:
                with fenced_transaction(conn, lease.key, lease.token, idle_timeout=1.0) as tx:
                    if tx.claim(item):
                        conn.execute(WRITE, (lease.key, item, lease.token, args.name))
            except psycopg.OperationalError:
                conn.close()
                conn = psycopg.connect(**sink)  # fate unknown: the ledger decides
                continue
            emit("wrote", item=n)
            n += 1
            time.sleep(args.item_sleep)
    store.complete(lease, {"items": args.items})
    emit("completed", token=lease.token)
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lease-dsn", default="")
    parser.add_argument("--sink-dsn", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=1.5)
    parser.add_argument("--item-sleep", type=float, default=0.05)
    parser.add_argument("--plain", action="store_true", help="the plugin disabled")
    parser.add_argument("--deadline", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.plain:
        return _plain(args)
    end = time.monotonic() + args.deadline
    with LeaseStore(args.lease_dsn, ttl=args.ttl, connect_timeout=1.0, pool_size=2) as store:
        while time.monotonic() < end:
            try:
                if _fenced_once(store, args):
                    return 0
            except StaleToken:
                emit("stale")
                return 5
            except (LeaseError, psycopg.Error) as exc:
                emit("retry", detail=str(exc)[:120])
                time.sleep(0.1)
    emit("gave_up")
    return 7


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
