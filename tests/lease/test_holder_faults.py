"""A holder SIGKILLed mid-work, and a holder SIGSTOPped inside its fenced transaction.

Real worker processes (``charge_worker.py``) charge customers into the sink database one per
fenced transaction; the assertions count the rows in the sink's ``charges`` table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_plugins.lease import Holder, LeaseStore, StaleToken, fenced_transaction
from tests.lease.waiting import wait_for

WORKER = Path(__file__).with_name("charge_worker.py")
KEY = "billing_nightly/charge/2024-02-15"
CUSTOMERS = 60


class Worker:
    """A charge_worker.py process whose JSON events are read on a thread as they come."""

    def __init__(self, lease_dsn: str, sink_dsn: str, name: str, *extra: str) -> None:
        self.name = name
        self._errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--lease-dsn",
                lease_dsn,
                "--sink-dsn",
                sink_dsn,
                "--key",
                KEY,
                "--name",
                name,
                "--customers",
                str(CUSTOMERS),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                self.events.append(event)

    def saw(self, event: str) -> dict[str, Any] | None:
        """The first event of that name so far, or None."""
        return next((e for e in self.events if e["event"] == event), None)

    def wait(self, timeout: float = 120) -> int:
        """Waits for the process to end; returns its exit code."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def stderr(self) -> str:
        """What the process wrote to stderr so far (the end of it)."""
        self._errors.seek(0)
        return self._errors.read()[-3000:]

    def stop(self) -> None:
        """Kills the process if it still runs and closes its pipes (test cleanup)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._errors.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Worker processes started by a test, killed at its end whatever happened."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def _charges(sink_dsn: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(sink_dsn) as conn:
        rows = conn.execute("SELECT customer, token, writer FROM charges ORDER BY id").fetchall()
    return [(str(c), int(t), str(w)) for c, t, w in rows]


def _once_each(charges: list[tuple[str, int, str]]) -> None:
    customers = [c for c, _, _ in charges]
    doubles = sorted({c for c in customers if customers.count(c) > 1})
    assert doubles == [], f"charged twice: {doubles}"
    assert sorted(customers) == [f"customer-{i:03d}" for i in range(CUSTOMERS)]


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
def test_a_sigkilled_holder_is_taken_over_within_ttl_plus_2s_and_nothing_is_charged_twice(
    lease_db: str, sink_db: str, workers: list[Worker]
) -> None:
    ttl = 2.0
    first = Worker(lease_db, sink_db, "billing-a", "--ttl", str(ttl), "--item-sleep", "0.05")
    workers.append(first)
    wait_for(lambda: first.saw("granted"), timeout=60)
    # the standby is already waiting (held) when the first one dies
    standby = Worker(lease_db, sink_db, "billing-b", "--ttl", str(ttl), "--item-sleep", "0.01")
    workers.append(standby)
    wait_for(lambda: standby.saw("waiting"), timeout=60)
    wait_for(lambda: len(_charges(sink_db)) >= 15, timeout=60)

    first.proc.send_signal(signal.SIGKILL)
    killed_at = datetime.now(UTC)
    assert first.wait(timeout=30) == -signal.SIGKILL

    assert standby.wait(timeout=120) == 0, standby.stderr()
    charges = _charges(sink_db)
    _once_each(charges)
    token_a = first.saw("granted")["token"]  # type: ignore[index]
    token_b = standby.saw("granted")["token"]  # type: ignore[index]
    assert token_b > token_a
    by_a = [c for c, t, w in charges if w == "billing-a"]
    assert len(by_a) >= 15
    assert all(t == token_a for _, t, w in charges if w == "billing-a")
    assert all(t == token_b for _, t, w in charges if w == "billing-b")
    assert standby.saw("skipped") is not None  # it skipped what the first one had done
    with LeaseStore(lease_db) as store:
        history = store.history(KEY)
        row = store.get(KEY)
    takeover = [r for r in history if r["outcome"] == "taken_over"]
    assert len(takeover) == 1
    assert takeover[0]["token"] == token_b
    assert takeover[0]["holder"]["name"] == "billing-b"
    assert f"from token {token_a}" in takeover[0]["reason"]
    assert takeover[0]["at"] - killed_at <= timedelta(seconds=ttl + 2)
    assert row is not None
    assert row["state"] == "succeeded"
    assert row["token"] == token_b
    assert row["result"]["charged"] == CUSTOMERS - len(by_a)


@pytest.mark.slow
def test_a_holder_paused_before_its_commit_cannot_commit_after_a_takeover(
    lease_db: str, sink_db: str, workers: list[Worker]
) -> None:
    ttl, idle = 2.0, 1.5
    first = Worker(
        lease_db, sink_db, "billing-a",
        "--ttl", str(ttl), "--idle-timeout", str(idle), "--pause-at", "20", "--item-sleep", "0.02",
    )  # fmt: skip
    workers.append(first)
    paused = wait_for(lambda: first.saw("paused"), timeout=60)
    assert paused is not None
    wait_for(lambda: _stopped(first.proc.pid), timeout=30)
    token_a = first.saw("granted")["token"]  # type: ignore[index]
    # the paused transaction holds the fence row with customer-020 written but not committed
    assert len(_charges(sink_db)) == 20

    second = Worker(lease_db, sink_db, "billing-b", "--ttl", str(ttl), "--item-sleep", "0.0")
    workers.append(second)
    assert second.wait(timeout=120) == 0, second.stderr()
    token_b = second.saw("granted")["token"]  # type: ignore[index]
    assert token_b > token_a
    # it took over only after the first one's lease had expired
    with LeaseStore(lease_db) as store:
        (takeover,) = [r for r in store.history(KEY) if r["outcome"] == "taken_over"]
    assert takeover["at"].timestamp() > paused["t"] + ttl - 1.0
    assert _stopped(first.proc.pid)

    os.kill(first.proc.pid, signal.SIGCONT)
    code = first.wait(timeout=60)

    # its commit failed (the session was ended while it was paused) and it stopped cleanly:
    # refused by the fence (5) or told by its keeper that the lease is lost (6)
    assert code in (5, 6), first.stderr()
    assert first.saw("resumed") is not None
    failed = first.saw("commit_failed")
    assert failed is not None
    assert failed["customer"] == "customer-020"
    charges = _charges(sink_db)
    _once_each(charges)
    assert {c for c, _, w in charges if w == "billing-a"} == {
        f"customer-{i:03d}" for i in range(20)
    }
    assert ("customer-020", token_b, "billing-b") in charges
    # and its token can never write there again
    with psycopg.connect(sink_dsn := sink_db, autocommit=True) as conn:
        with pytest.raises(StaleToken):
            with fenced_transaction(conn, KEY, token_a) as tx:
                tx.claim("customer-999")
    assert len(_charges(sink_dsn)) == CUSTOMERS
    with LeaseStore(lease_db) as store:
        row = store.get(KEY)
        assert store.acquire(KEY, Holder.process("late")).result == row["result"]  # type: ignore[index]
    assert row is not None
    assert row["state"] == "succeeded"
    assert row["token"] == token_b
