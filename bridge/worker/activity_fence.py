"""The fence a task's work receives inside a Temporal activity.

The same work function runs under Airflow's protected operator and here: it gets the key, the
token and a ``transaction()`` that opens the sink's fenced transaction. In shadow mode that
transaction runs the writes, captures what they wrote, and rolls back, so the sink is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from airflow_plugins.lease import (
    Lease,
    connect_sink,
    fenced_transaction,
)
from airflow_plugins.lease.fence import Fence, SinkConnect, SinkWrite
from airflow_plugins.lease.keys import SHADOW_SUFFIX
from airflow_plugins.protection import config
from bridge.sql import query

MAX_CAPTURED_ROWS = 10_000


def sink_dsn(conn_id: str) -> str:
    """The sink connection's DSN from ``AIRFLOW_CONN_<ID>``, as Airflow's tasks resolve it.

    Raises:
        SinkNotConfigured: the variable is missing or not a Postgres connection.
    """
    return config.sink_dsn(conn_id, metastore=False)


class _ShadowRollback(Exception):
    """Raised inside a shadow transaction to roll it back after its rows were captured."""


class BridgeFence(Fence):
    """The Airflow operator's ``Fence``, inside a Temporal activity; in shadow mode its
    transactions capture what they wrote and roll back.

    Args:
        key: the lease key (the shadow key in shadow mode).
        lease: the held lease.
        business_date: the business date of the run.
        sink: the sink's DSN, or None when the task has no sink.
        shadow: capture and roll back instead of committing.
    """

    def __init__(self, *, lease: Lease, business_date: str, sink: str | None, shadow: bool) -> None:
        connect = None if sink is None else _connector(sink)
        super().__init__(
            key=lease.key,
            token=lease.token,
            attempt=lease.attempt,
            business_date=business_date,
            lease=lease,
            sink_connect=connect,
        )
        self.shadow = shadow
        self.captured_items: list[str] = []
        self.captured_rows: dict[str, list[Any]] = {}

    @property
    def primary_key(self) -> str:
        """The primary's lease key (a shadow's key without its suffix)."""
        return self.key.removesuffix(SHADOW_SUFFIX) if self.shadow else self.key

    @property
    def would_send(self) -> list[dict[str, Any]]:
        """The requests a shadow's external calls would have sent (empty when primary)."""
        return [] if self._calls is None else list(self._calls.would_send)

    def advance_sink_fence(self) -> None:
        """Raises the sink's fence before any work; a shadow leaves no trace, so not there."""
        if not self.shadow:
            super().advance_sink_fence()

    def done_items(self) -> list[str]:
        """The key's done items; in shadow mode with those this run captured (rolled back)."""
        done = super().done_items()
        if self.shadow:
            return sorted(set(done) | set(self.captured_items))
        return done

    @contextmanager
    def transaction(self) -> Iterator[SinkWrite]:
        """A fenced transaction on the sink; in shadow mode captured and rolled back.

        Raises:
            StaleToken: a newer holder has written under this key; nothing was written.
            FenceStopped: the work must stop.
        """
        if not self.shadow:
            with super().transaction() as write:
                yield write
            return
        self.check()
        conn = self.connection()
        try:
            with fenced_transaction(
                conn,
                self.key,
                self.token,
                idle_timeout=self.idle_timeout,
                generation=self.generation,
            ) as tx:
                yield tx
                self._capture(conn)
                raise _ShadowRollback
        except _ShadowRollback:
            pass

    def _capture(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(query("sink_ledger_items"), {"keys": [self.key]}).fetchall()
        self.captured_items.extend(str(r[1]) for r in rows)
        for schema, table in conn.execute(query("sink_tables")).fetchall():
            composed = sql.SQL(query("rows_written_in_transaction")).format(
                table=sql.Identifier(schema, table)
            )
            got = conn.execute(composed, {"limit": MAX_CAPTURED_ROWS}).fetchall()
            if got:
                self.captured_rows.setdefault(f"{schema}.{table}", []).extend(r[0] for r in got)


def _connector(dsn: str) -> SinkConnect:
    def connect() -> psycopg.Connection[Any]:
        return connect_sink(dsn)  # keepalives, tcp_user_timeout, connect_timeout

    return connect
