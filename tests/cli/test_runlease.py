"""The operators' command line, run as a user runs it: a real process on the real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest

from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore
from airflow_plugins.lease.migrations import migrations

KEY = "billing_nightly/charge/2024-02-15"


def runlease(dsn: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EXACTLY_ONCE_LEASE_DSN"}
    if dsn:
        env["EXACTLY_ONCE_LEASE_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-c", "from airflow_plugins.lease.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_migrate_creates_lease_store_and_sink_fence(empty_db: str, sink_db: str) -> None:
    done = runlease(empty_db, "migrate", "--sink", sink_db)
    assert done.returncode == 0, done.stderr
    every = [m.version for m in migrations(LEASE_STORE)]  # no count hard-coded: they grow
    assert json.loads(done.stdout.splitlines()[0]) == {"lease_store": every}
    again = runlease(empty_db, "migrate")
    assert json.loads(again.stdout) == {"lease_store": []}
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regclass('runlease.lease')").fetchone() == (
            "runlease.lease",
        )


def test_leases_history_and_admin_changes_record_who_and_why(lease_db: str) -> None:
    with LeaseStore(lease_db, ttl=30) as store:
        first = store.acquire(KEY, Holder.process("billing-a")).lease
        assert store.acquire(KEY, Holder.process("billing-b")).outcome == "held"

    live = runlease(lease_db, "--json", "leases", "--live")
    rows = [json.loads(line) for line in live.stdout.splitlines()]
    assert [(r["key"], r["token"], r["holder"]["name"]) for r in rows] == [
        (KEY, first.token, "billing-a")
    ]
    blocked = runlease(lease_db, "--json", "leases", "--blocked")
    assert [json.loads(line)["holder"]["name"] for line in blocked.stdout.splitlines()] == [
        "billing-b"
    ]

    released = runlease(
        lease_db, "force-release", KEY, "--reason", "host lost", "--actor", "oncall@example"
    )
    assert released.returncode == 0, released.stderr
    assert f"released token {first.token}" in released.stdout

    history = runlease(lease_db, "--json", "history", KEY)
    events = [json.loads(line) for line in history.stdout.splitlines()]
    assert [(e["event"], e["outcome"]) for e in events] == [
        ("acquire", "granted"),
        ("acquire", "held"),
        ("force_release", "released"),
    ]
    assert events[-1]["actor"] == "oncall@example"
    assert events[-1]["reason"] == "host lost"


def test_override_lets_a_succeeded_key_run_once_more(lease_db: str) -> None:
    with LeaseStore(lease_db) as store:
        lease = store.acquire(KEY, Holder.process("a")).lease
        store.complete(lease, {"charged": 340})
        done = runlease(
            lease_db, "override", KEY, "--reason", "re-bill after fix", "--actor", "cfo"
        )
        assert done.stdout.strip() == "approved", done.stderr
        again = store.acquire(KEY, Holder.process("b"))
        assert again.outcome == "granted"
        assert again.token is not None
        assert again.token > lease.token
        assert store.acquire(KEY, Holder.process("c")).outcome == "held"


@pytest.mark.parametrize("reason", ["", "   "])
def test_admin_change_without_a_reason_is_refused_and_changes_nothing(
    lease_db: str, reason: str
) -> None:
    with LeaseStore(lease_db) as store:
        lease = store.acquire(KEY, Holder.process("a")).lease
        done = runlease(lease_db, "force-release", KEY, "--reason", reason)
        assert done.returncode == 1
        assert "needs an actor and a reason" in done.stderr
        row = store.get(KEY)
        assert row is not None
        assert (row["state"], row["token"]) == ("running", lease.token)


def test_missing_dsn_is_a_clear_usage_error() -> None:
    done = runlease(None, "leases")
    assert done.returncode == 2
    assert "EXACTLY_ONCE_LEASE_DSN" in done.stderr


def test_unreachable_store_fails_with_a_clear_error() -> None:
    done = runlease("postgresql://postgres@127.0.0.1:1/none?connect_timeout=1", "leases")
    assert done.returncode == 3
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr
    assert "lease store unavailable" in done.stderr


def test_global_options_go_after_the_subcommand_too(empty_db: str, sink_db: str) -> None:
    done = runlease(None, "migrate", "--dsn", empty_db, "--sink", sink_db)
    assert done.returncode == 0, done.stderr
    every = [m.version for m in migrations(LEASE_STORE)]  # no count hard-coded: they grow
    assert json.loads(done.stdout.splitlines()[0]) == {"lease_store": every}
    with LeaseStore(empty_db, ttl=30) as store:
        lease = store.acquire(KEY, Holder.process("billing-a")).lease
    after = runlease(None, "leases", "--live", "--dsn", empty_db, "--json")
    before = runlease(empty_db, "--json", "leases", "--live")
    assert after.stdout == before.stdout
    assert [json.loads(line)["token"] for line in after.stdout.splitlines()] == [lease.token]
    released = runlease(empty_db, "force-release", KEY, "--reason", "host lost", "--json")
    assert json.loads(released.stdout) == {"key": KEY, "released_token": lease.token}


def test_usage_errors_are_one_line_with_exit_2() -> None:
    done = runlease(None, "leases", "--bogus")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "runlease: error: unrecognized arguments: --bogus (see runlease --help)"
    )


def test_help_shows_examples_and_exit_codes() -> None:
    for args in (("--help",), ("migrate", "--help")):
        done = runlease(None, *args)
        assert done.returncode == 0
        assert "examples:\n  runlease migrate --dsn" in done.stdout
        assert "3  unreachable" in done.stdout


def test_a_bad_sink_dsn_fails_on_one_line_and_migrates_nothing(empty_db: str) -> None:
    done = runlease(
        None, "migrate", "--dsn", empty_db, "--sink", "postgresql://nobody@127.0.0.1:1/x"
    )
    assert done.returncode == 3
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("runlease: error: ")
