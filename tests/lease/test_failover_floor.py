"""The lease store's failover procedure of docs/operating.md, on a private Postgres whose
fencing sequence was set back (as a promoted asynchronous standby's can be).

First what really happens without the procedure: a holder whose grant survived renews as if
nothing happened (setval changes no lease row), and a key granted again draws a token its sink
already saw, so the new holder's writes are refused. Then the procedure, run exactly as the docs
write it: the old holder's next renew fails, the new grant is above every token the sink saw,
its write is accepted and the old holder's is refused.
"""

from __future__ import annotations

import re
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres
from airflow_plugins.lease import (
    LEASE_STORE,
    SINK_FENCE,
    Holder,
    LeaseLost,
    LeaseStore,
    StaleToken,
    fenced_transaction,
    migrate,
)
from tests.lease.ports import free_port

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operating.md"
KEY = "billing_nightly/charge/2024-02-15"
SURVIVOR = "billing_nightly/refund/2024-02-15"


def _procedure() -> str:
    text = DOCS.read_text()
    block = re.search(r"<!-- failover-floor -->\s*```sql\n(.*?)```", text, re.DOTALL)
    assert block is not None, "docs/operating.md lost its failover-floor block"
    return "\n".join(line.strip() for line in block.group(1).splitlines())


@pytest.fixture
def server() -> Iterator[EmbeddedPostgres]:
    """A private PostgreSQL server (the promoted standby), deleted afterwards."""
    port = free_port()
    datadir = Path(tempfile.gettempdir()) / f"eo-floor-{port}-{uuid.uuid4().hex[:8]}"
    pg = EmbeddedPostgres(port, datadir=datadir)
    pg.start()
    try:
        yield pg
    finally:
        pg.destroy()


def _write(sink: str, key: str, token: int) -> bool:
    """A fenced write at the sink: True if it committed, False if the fence refused it."""
    with psycopg.connect(sink) as conn:
        conn.autocommit = True
        try:
            with fenced_transaction(conn, key, token) as tx:
                tx.claim(f"write-{token}")
        except StaleToken:
            return False
    return True


def test_the_documented_floor_procedure_is_safe_after_the_sequence_went_back(
    server: EmbeddedPostgres,
) -> None:
    store_dsn, sink = server.dsn("postgres"), server.dsn("postgres")
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE sink")
    sink = server.dsn("sink")
    migrate(store_dsn, LEASE_STORE)
    migrate(sink, SINK_FENCE)
    with LeaseStore(store_dsn) as store:
        # the old primary granted both keys after others; the sink saw their tokens
        for _ in range(20):
            store.acquire(f"other/t/{uuid.uuid4().hex[:8]}", Holder.process("x"), ttl=600)
        survivor = store.acquire(SURVIVOR, Holder.process("survivor"), ttl=600).lease
        old = store.acquire(KEY, Holder.process("old primary's holder"), ttl=600).lease
        assert _write(sink, KEY, old.token)
        assert _write(sink, SURVIVOR, survivor.token)
        # the failover: the standby never saw KEY's grant, and its sequence is behind
        with store.connection() as conn:
            conn.execute("DELETE FROM runlease.lease WHERE key = %s", (KEY,))
            conn.execute("SELECT setval('runlease.fencing_token', 1)")

        # what really happens: the survivor renews as before, and KEY is granted again with a
        # token its sink already saw, so the new holder cannot write
        store.renew(survivor)
        again = store.acquire(KEY, Holder.process("new holder, no floor"), ttl=600).lease
        assert again.token <= old.token
        assert not _write(sink, KEY, again.token)

        # the procedure, as docs/operating.md writes it
        with psycopg.connect(sink) as conn:
            sink_max = conn.execute("SELECT coalesce(max(token), 0) FROM runfence.fence").fetchone()
        assert sink_max is not None
        with psycopg.connect(store_dsn, autocommit=True) as conn:
            for statement in _procedure().split(";"):
                if statement.strip():
                    conn.execute(statement.replace(":sink_max", str(int(sink_max[0]))).encode())

        # every holder of the failover stops at its next renew
        for stale in (survivor, again):
            with pytest.raises(LeaseLost):
                store.renew(stale)
        # the keys are granted again above every token the sinks saw, and those writes win
        for key, previous in ((KEY, old), (SURVIVOR, survivor)):
            fresh = store.acquire(key, Holder.process("after the floor"), ttl=600).lease
            assert fresh.token > int(sink_max[0])
            assert _write(sink, key, fresh.token)
            assert not _write(sink, key, previous.token)
        released = [r for r in store.history(SURVIVOR) if r["event"] == "force_release"]
        assert [(r["actor"], r["reason"]) for r in released] == [
            ("failover", "token floor after failover")
        ]
