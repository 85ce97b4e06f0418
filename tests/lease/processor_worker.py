"""A billing holder charging at the payment processor (run as a script: a real OS process).

It takes the lease of one billing run, keeps it renewed, and charges each customer with the
external-call API and the stripe SDK, recording each answer in the sink's ``charges`` table.
It can freeze itself (SIGSTOP) right after the processor accepted a customer's charge and
before its record commits (``--pause-after-send``), or after claiming a customer and before
sending (``--pause-before-send``). One JSON event per line: granted, paused, resumed, charged,
stale, completed.

Exit codes: 0 done, 5 refused as superseded (at the sink or at the processor), 6 lease lost.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from airflow_plugins.lease import Holder, LeaseKeeper, LeaseLost, LeaseStore, StaleToken
from airflow_plugins.lease.external_call import CallAnswer, ExternalCalls, OutgoingCall

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dags"))
import billing_charges


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed at once."""
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def _freeze(where: str, customer: str) -> None:
    emit("paused", where=where, customer=customer)
    os.kill(os.getpid(), signal.SIGSTOP)
    emit("resumed", customer=customer)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    for name in ("--lease-dsn", "--sink-dsn", "--key", "--name", "--processor"):
        parser.add_argument(name, required=True)
    parser.add_argument("--customers", type=int, default=20)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--pause-after-send", type=int, default=-1)
    parser.add_argument("--pause-before-send", type=int, default=-1)
    parser.add_argument("--lookup", action="store_true")
    args = parser.parse_args(argv)
    with LeaseStore(args.lease_dsn, ttl=args.ttl) as store:
        deadline = time.monotonic() + 60
        got = store.acquire(args.key, Holder.process(args.name))
        while not got.granted and time.monotonic() < deadline:
            time.sleep(0.1)
            got = store.acquire(args.key, Holder.process(args.name))
        if not got.granted:
            emit("gave_up")
            return 7
        lease = got.lease
        emit("granted", token=lease.token)
        client = billing_charges.stripe_client(args.processor)
        sender = billing_charges.stripe_sender(client)
        lookup = billing_charges.stripe_lookup(client) if args.lookup else None
        conn = psycopg.connect(args.sink_dsn, autocommit=True)
        try:
            with LeaseKeeper(store, lease) as keeper:
                ext = ExternalCalls(lambda: conn, lease.key, lease.token, check=keeper.check)
                for i in range(args.customers):
                    customer = f"cust-{i + 1:04d}"

                    def send(call: OutgoingCall, i: int = i) -> CallAnswer:
                        if i == args.pause_before_send:
                            _freeze("before_send", call.item)
                        answer = sender(call)
                        if i == args.pause_after_send:
                            _freeze("after_send", call.item)  # the processor has charged
                        return answer

                    result = ext.call(
                        customer,
                        billing_charges.charge_params("2024-02-15", customer),
                        send,
                        lookup=lookup,
                        record=_record(args.name),
                    )
                    emit("charged", customer=customer, state=result.state, sent=result.sent)
            store.complete(lease, {"by": args.name})
        except StaleToken as exc:
            emit("stale", token=lease.token, detail=str(exc))
            return 5
        except LeaseLost as exc:
            emit("lost", token=lease.token, detail=str(exc))
            return 6
        finally:
            conn.close()
    emit("completed", token=lease.token)
    return 0


def _record(writer: str) -> Any:
    def record(tx: Any, result: Any) -> None:
        tx.conn.execute(
            "INSERT INTO charges (run_key, customer, token, writer) VALUES (%s, %s, %s, %s)",
            (tx.key, result.item, tx.token, f"{writer}:{result.reference}"),
        )

    return record


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
