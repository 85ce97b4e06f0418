"""Postgres restarted (crash-like) under working holders, on a private server of the test's own.

Both the lease store and the sink live on the restarted server, so every holder loses both at
once, mid-transaction. Holders ride it out (retrying after LeaseStoreUnavailable) or stop
cleanly (their lease lost); whoever finishes each run, every customer is charged exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres
from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, LeaseStore, migrate
from tests.lease.ports import free_port
from tests.lease.waiting import wait_for

WORKER = Path(__file__).with_name("charge_worker.py")
KEYS = [f"billing_nightly/charge/2024-02-15/shard-{i}" for i in range(3)]
CUSTOMERS = 60
TTL = 3.0


@pytest.fixture
def private_pg() -> Iterator[EmbeddedPostgres]:
    """A private PostgreSQL server on a port of engineer A's range, deleted afterwards."""
    port = free_port()
    datadir = Path(tempfile.gettempdir()) / f"eo-lease-test-{port}-{uuid.uuid4().hex[:8]}"
    server = EmbeddedPostgres(port, datadir=datadir)
    server.start()
    try:
        yield server
    finally:
        server.destroy()


class HolderProcess:
    """One charge_worker.py process; its output goes to files (pipes could fill and block it)."""

    def __init__(self, lease_dsn: str, sink_dsn: str, key: str, name: str) -> None:
        self._out = tempfile.TemporaryFile(mode="w+")
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--lease-dsn", lease_dsn,
                "--sink-dsn", sink_dsn,
                "--key", key,
                "--name", name,
                "--customers", str(CUSTOMERS),
                "--ttl", str(TTL),
                "--item-sleep", "0.05",
                "--retry",
                "--deadline", "90",
            ],
            stdout=self._out,
            stderr=self._err,  # kept apart: log lines must not cut into the JSON lines
            text=True,
        )  # fmt: skip

    def finish(self, timeout: float) -> tuple[int, list[dict[str, object]], str]:
        """Waits for the end; returns (exit code, JSON events, the end of stderr)."""
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._out.seek(0)
        self._err.seek(0)
        events = [json.loads(line) for line in self._out if line.startswith("{")]
        errors = self._err.read()[-2000:]
        self._out.close()
        self._err.close()
        return code, events, errors


def _charged(sink_dsn: str) -> int:
    try:
        with psycopg.connect(sink_dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM charges").fetchone()
    except psycopg.OperationalError:
        return 0
    return int(row[0]) if row else 0


def _charged_after_outage(names: list[str]) -> bool:
    """The holder hit the outage (a failed commit or no connection), then charged again."""
    hit = [i for i, name in enumerate(names) if name in ("commit_failed", "unavailable")]
    return bool(hit) and "charged" in names[hit[0] :]


@pytest.mark.slow
def test_holders_survive_a_postgres_restart_without_double_or_lost_charges(
    private_pg: EmbeddedPostgres,
) -> None:
    lease_dsn = private_pg.create_database("leases")
    sink_dsn = private_pg.create_database("billing")
    migrate(lease_dsn, LEASE_STORE)
    migrate(sink_dsn, SINK_FENCE)
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE charges (id bigserial PRIMARY KEY, run_key text NOT NULL, "
            "customer text NOT NULL, token bigint, writer text)"
        )
    # two holders per billing shard: one works, one waits as the standby
    holders = [
        HolderProcess(lease_dsn, sink_dsn, key, f"{role}-{i}")
        for i, key in enumerate(KEYS)
        for role in ("primary", "standby")
    ]
    try:
        wait_for(lambda: _charged(sink_dsn) >= 20, timeout=90)
        # a crash (no clean shutdown, then crash recovery), short enough to ride out
        private_pg.restart("immediate")
        wait_for(lambda: _charged(sink_dsn) >= 60, timeout=90)
        # then an outage longer than the lease TTL: holders lose their leases and stop,
        # the standbys take over when the server is back
        private_pg.stop("immediate")
        time.sleep(TTL + 1.5)
        private_pg.start()
    except BaseException:
        for holder in holders:
            holder.proc.kill()
        raise
    finally:
        ends = [h.finish(timeout=180) for h in holders]

    codes = [code for code, _, _ in ends]
    events = [ev for _, ev, _ in ends]
    # each holder either finished or stopped cleanly (lease lost / refused by the fence)
    assert set(codes) <= {0, 5, 6}, [(code, err) for code, _, err in ends]
    assert any(e["event"] == "unavailable" for ev in events for e in ev)
    assert any(e["event"] == "commit_failed" for ev in events for e in ev)

    # whoever is left finishes the runs no holder finished (at least once)
    with LeaseStore(lease_dsn) as store:
        unfinished = [k for k in KEYS if (store.get(k) or {}).get("state") != "succeeded"]
    for key in unfinished:
        code, _, err = HolderProcess(lease_dsn, sink_dsn, key, "finisher").finish(timeout=120)
        assert code == 0, err

    with psycopg.connect(sink_dsn) as conn:
        rows = conn.execute(
            "SELECT run_key, customer, count(*) FROM charges GROUP BY 1, 2"
        ).fetchall()
        ledger = conn.execute("SELECT count(*) FROM runfence.ledger").fetchone()
    assert [r for r in rows if r[2] != 1] == []
    assert sorted((str(k), str(c)) for k, c, _ in rows) == sorted(
        (k, f"customer-{i:03d}") for k in KEYS for i in range(CUSTOMERS)
    )
    assert ledger == (len(KEYS) * CUSTOMERS,)
    with LeaseStore(lease_dsn) as store:
        for key in KEYS:
            row = store.get(key)
            assert row is not None
            assert row["state"] == "succeeded"
            completes = [r for r in store.history(key) if r["event"] == "complete"]
            assert len(completes) == 1
            assert completes[0]["token"] == row["token"]
        takeovers = [r for key in KEYS for r in store.history(key) if r["outcome"] == "taken_over"]
    # some holder kept working through the crash (charged again after Postgres was back);
    # some lost its lease in the long outage, stopped cleanly, and was taken over
    story = [[str(e["event"]) for e in ev if e["event"] != "waiting"] for ev in events]
    assert any(_charged_after_outage(names) for names in story), story
    assert 6 in codes, story
    assert takeovers, story
