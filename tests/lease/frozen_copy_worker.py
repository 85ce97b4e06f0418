"""A holder that freezes itself inside its fenced transaction, mid-``COPY FROM STDIN``.

Run by ``test_frozen_holder.py``: it opens the fenced transaction for ``--token``, claims the
customers, starts a COPY of their charges, sends the first row, prints ``copying`` and stops
itself (SIGSTOP). The server meanwhile waits on it inside the COPY: the session is active, not
idle, so no idle timeout ends it. When continued it sends the rest and commits, and prints
``committed``, or ``failed: <error>`` when the sink refused it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import psycopg

from airflow_plugins.lease import fenced_transaction


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sink-dsn", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--token", type=int, required=True)
    parser.add_argument("--customers", type=int, required=True)
    args = parser.parse_args()
    customers = [f"customer-{i:03d}" for i in range(args.customers)]
    try:
        with (
            psycopg.connect(args.sink_dsn, autocommit=True) as conn,
            fenced_transaction(conn, args.key, args.token) as tx,
        ):
            todo = tx.claim_many(customers)
            with conn.cursor().copy(
                "COPY charges (run_key, customer, token, writer) FROM STDIN"
            ) as copy:
                for n, customer in enumerate(todo):
                    copy.write_row((args.key, customer, args.token, "frozen"))
                    if n == 0:
                        print("copying", flush=True)
                        os.kill(os.getpid(), signal.SIGSTOP)
        print("committed", flush=True)
        return 0
    except psycopg.Error as exc:
        print(f"failed: {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
