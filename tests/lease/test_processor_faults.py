"""Holders frozen with SIGSTOP around a call to the payment processor, as real OS processes.

Two ``processor_worker.py`` processes are the two executions of one billing run; the first
freezes itself past its lease, the second takes over and finishes, the first is resumed. The
assertions count the charges at the processor and the rows in the sink.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_plugins.demo.processor import PaymentProcessor
from tests.lease.waiting import wait_for

WORKER = Path(__file__).with_name("processor_worker.py")
KEY = "billing_nightly/charge/2024-02-15"
CUSTOMERS = 20
PAUSE_AT = 5


class Worker:
    """A processor_worker.py process whose JSON events are read as they come."""

    def __init__(self, lease_dsn: str, sink_dsn: str, url: str, name: str, *extra: str) -> None:
        self._errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                *("--lease-dsn", lease_dsn, "--sink-dsn", sink_dsn, "--processor", url),
                *("--key", KEY, "--name", name, "--customers", str(CUSTOMERS), "--ttl", "1.5"),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def saw(self, event: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] == event), None)

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def stderr(self) -> str:
        self._errors.seek(0)
        return self._errors.read()[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._errors.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.kill()


def sink_rows(sink_db: str) -> Counter[str]:
    with psycopg.connect(sink_db, autocommit=True) as conn:
        return Counter(r[0] for r in conn.execute("SELECT customer FROM charges").fetchall())


def run_frozen_then_taken_over(
    lease_db: str, sink_db: str, url: str, workers: list[Worker], *old_args: str
) -> tuple[Worker, Worker]:
    """A freezes where ``old_args`` say, B takes over and finishes, A is resumed."""
    old = Worker(lease_db, sink_db, url, "a", *old_args)
    workers.append(old)
    wait_for(lambda: old.saw("paused"), timeout=60)
    new = Worker(lease_db, sink_db, url, "b", *[a for a in old_args if a == "--lookup"])
    workers.append(new)
    assert new.wait() == 0, new.stderr()
    old.proc.send_signal(signal.SIGCONT)
    return old, new


@pytest.mark.timeout(120)
def test_frozen_after_the_processor_accepted_each_customer_is_charged_once(
    lease_db: str, sink_db: str, workers: list[Worker]
) -> None:
    with PaymentProcessor() as processor:
        old, _ = run_frozen_then_taken_over(
            lease_db, sink_db, processor.url, workers, "--pause-after-send", str(PAUSE_AT)
        )
        assert old.wait() == 5, old.stderr()  # its record is refused at the sink's fence
        at_processor = Counter(c["customer"] for c in processor.charges())
    customers = {f"cust-{i:04d}" for i in range(1, CUSTOMERS + 1)}
    assert at_processor == dict.fromkeys(customers, 1)
    assert sink_rows(sink_db) == dict.fromkeys(customers, 1)
    frozen = old.saw("paused")
    assert frozen is not None
    assert frozen["where"] == "after_send"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["idempotency", "tokens"])
def test_a_late_request_is_a_replay_or_refused_at_the_processor(
    lease_db: str, sink_db: str, workers: list[Worker], kind: str
) -> None:
    tokens = kind == "tokens"
    extra = ["--pause-before-send", str(PAUSE_AT)] + (["--lookup"] if tokens else [])
    with PaymentProcessor(idempotency=not tokens, check_tokens=tokens) as processor:
        old, new = run_frozen_then_taken_over(lease_db, sink_db, processor.url, workers, *extra)
        assert old.wait() == 5, old.stderr()
        at_processor = Counter(c["customer"] for c in processor.charges())
        refused = processor.refused()
    customers = {f"cust-{i:04d}" for i in range(1, CUSTOMERS + 1)}
    assert at_processor == dict.fromkeys(customers, 1)
    assert sink_rows(sink_db) == dict.fromkeys(customers, 1)
    old_token = (old.saw("granted") or {})["token"]
    if tokens:
        assert [r["token"] for r in refused] == [old_token]  # the late call refused
    else:
        assert refused == []  # a replay: the processor answered it, charging nothing new
    assert (new.saw("granted") or {})["token"] > old_token
