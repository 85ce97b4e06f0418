"""Migrations: idempotent, and safe when eight processes migrate a fresh database at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psycopg
import pytest

from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, Holder, LeaseStore, Outcome, migrate
from airflow_plugins.lease.migrations import current_version, migrations

RACE = """
import json, sys, time
from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, migrate
dsn, start = sys.argv[1], float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
print(json.dumps({"store": migrate(dsn, LEASE_STORE), "fence": migrate(dsn, SINK_FENCE)}))
"""


def _versions(dsn: str, schema: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT version FROM {schema}.schema_migrations ORDER BY version")
        return [int(r[0]) for r in rows.fetchall()]


def test_migrate_is_idempotent(empty_db: str) -> None:
    latest = len(migrations(LEASE_STORE))
    assert current_version(empty_db) == 0

    assert migrate(empty_db, LEASE_STORE) == list(range(1, latest + 1))
    assert migrate(empty_db, LEASE_STORE) == []
    assert migrate(empty_db, SINK_FENCE) == list(range(1, len(migrations(SINK_FENCE)) + 1))
    assert migrate(empty_db, SINK_FENCE) == []

    assert current_version(empty_db) == latest
    assert _versions(empty_db, "runlease") == list(range(1, latest + 1))
    with LeaseStore(empty_db) as store:
        assert store.acquire("k/t/2024-02-15", Holder.process("m")).outcome is Outcome.GRANTED


def test_reapplying_the_migration_text_keeps_the_data(lease_db: str) -> None:
    """Each statement is idempotent itself: a half-applied or repeated file breaks nothing."""
    with LeaseStore(lease_db) as store:
        lease = store.acquire("k/t/2024-02-15", Holder.process("m")).lease
        store.complete(lease, {"n": 1})
    with psycopg.connect(lease_db) as conn:
        for migration in migrations(LEASE_STORE):
            conn.execute(migration.text.encode())
    with LeaseStore(lease_db) as store:
        again = store.acquire("k/t/2024-02-15", Holder.process("m2"))
        assert again.outcome is Outcome.SUCCEEDED
        assert again.result == {"n": 1}
        assert len(store.history("k/t/2024-02-15")) == 3


@pytest.mark.slow
def test_eight_processes_migrating_at_once_apply_each_version_exactly_once(empty_db: str) -> None:
    start = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, empty_db, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]

    assert [p.returncode for p in procs] == [0] * 8, [err for _, err in outputs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    latest, fence_latest = len(migrations(LEASE_STORE)), len(migrations(SINK_FENCE))
    applied = sorted(v for r in results for v in r["store"])
    assert applied == list(range(1, latest + 1))
    assert sorted(v for r in results for v in r["fence"]) == list(range(1, fence_latest + 1))
    assert _versions(empty_db, "runlease") == list(range(1, latest + 1))
    assert _versions(empty_db, "runfence") == list(range(1, fence_latest + 1))
    with psycopg.connect(empty_db) as conn:
        parts = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'runlease.audit'::regclass"
        ).fetchone()
    assert parts == (6,)  # default + last month .. three months ahead
    with LeaseStore(empty_db) as store:
        assert store.acquire("k/t/2024-02-15", Holder.process("m")).outcome is Outcome.GRANTED
