"""Least-privilege roles of the lease store: a task role, an operator role and a read-only role.

    python -m airflow_plugins.lease.roles --task runlease_task --operator runlease_operator \
        --reader runlease_reader          # DSN of the store's owner in RUNLEASE_DSN

Run as the store's owner after ``runlease migrate`` (the grants are in ``sql/roles.sql``; the
roles must exist, created by whoever manages logins). The task role runs the lease statements
and appends to the audit; the operator role adds force-release and re-run approvals; the reader
role only reads (the pages). No role but the owner can change or delete an audit row (grants and
the ``audit_append_only`` trigger); ``runlease maintain`` runs as the owner.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import resources

import psycopg
from psycopg import sql

ROLES_SQL = "roles.sql"


def grant_roles(conninfo: str, *, task: str, operator: str, reader: str) -> None:
    """Grants the three roles their privileges on the lease store (idempotent).

    Raises:
        psycopg.Error: a role does not exist, or the caller does not own the store.
    """
    text = resources.files("airflow_plugins.lease").joinpath("sql", ROLES_SQL).read_text()
    names = {"task": task, "operator": operator, "reader": reader}
    with psycopg.connect(conninfo) as conn:
        for statement in _statements(text):
            conn.execute(
                sql.SQL(statement).format(**{k: sql.Identifier(v) for k, v in names.items()})
            )


def _statements(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m airflow_plugins.lease.roles --task ... --operator ... --reader``."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_plugins.lease.roles", description=__doc__
    )
    parser.add_argument("--task", required=True, help="role of task processes and the listener")
    parser.add_argument("--operator", required=True, help="role of administrative changes")
    parser.add_argument("--reader", required=True, help="role of the pages (read-only)")
    args = parser.parse_args(argv)
    dsn = os.environ.get("RUNLEASE_DSN", "")
    if not dsn:
        print("set RUNLEASE_DSN to the lease store's DSN, as its owner", file=sys.stderr)
        return 2
    try:
        grant_roles(dsn, task=args.task, operator=args.operator, reader=args.reader)
    except psycopg.Error as exc:
        print(f"grant failed: {exc.diag.message_primary or type(exc).__name__}", file=sys.stderr)
        return 1
    print(f"granted: task={args.task} operator={args.operator} reader={args.reader}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
