"""An ambiguous commit at the sink: the commit reaches Postgres, its answer never comes back.

The campaign's proxy drops the server's answer to the fenced transaction's COMMIT and keeps
the socket open (no TCP timeout sees it). The holder must not wait forever, past its lease:
the fence ends the call on its own clock, the caller sees a dropped connection, and its retry
finds the item in the ledger, so the charge is in the sink once.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from airflow_plugins.lease import connect_sink, fenced_transaction
from tests.chaos.proxy import Proxy

KEY = "billing_nightly/charge/2026-12-01"
CHARGE = "INSERT INTO charges (run_key, customer, token, writer) VALUES (%s, %s, %s, %s)"


@pytest.fixture
def proxied(sink_db: str) -> Iterator[tuple[Proxy, str]]:
    params = psycopg.conninfo.conninfo_to_dict(sink_db)
    proxy = Proxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    proxy.start()
    port = proxy.add_route("sink", autocommit=False)
    try:
        yield (
            proxy,
            psycopg.conninfo.make_conninfo(
                sink_db, host="127.0.0.1", port=port, sslmode="disable", gssencmode="disable"
            ),
        )
    finally:
        proxy.stop()


def _charge(conn: psycopg.Connection[object], token: int, writer: str) -> None:
    with fenced_transaction(conn, KEY, token, call_timeout=1.0) as tx:
        if tx.claim("customer-001"):
            conn.execute(CHARGE, (KEY, "customer-001", token, writer))


@pytest.mark.timeout(60)
def test_a_lost_commit_answer_ends_the_call_and_the_retry_charges_nothing_again(
    proxied: tuple[Proxy, str], sink_db: str
) -> None:
    proxy, dsn = proxied
    fired: list[bool] = []
    proxy.arm_ambiguous("sink", lambda: fired.append(True), 30)
    with connect_sink(dsn) as conn, pytest.raises(psycopg.OperationalError):
        _charge(conn, 1, "first")  # committed at the server; the answer is dropped
    assert fired == [True]
    with connect_sink(dsn) as conn:
        _charge(conn, 1, "retry")  # the same holder's retry, on a new connection
    with psycopg.connect(sink_db) as conn:
        rows = conn.execute("SELECT customer, writer FROM charges").fetchall()
    assert rows == [("customer-001", "first")]
