"""The README's "Using the lease store", as the file ``docs/examples/billing_activity.py``, run
against the real Postgres: attempts of a Temporal activity (``ActivityEnvironment``, no server)
charge each customer once through a failure, a held key is answered without spending an
attempt, the async form runs off the event loop, and the constraints the README states hold."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from airflow_plugins.lease import (
    Holder,
    InvalidLeaseInput,
    LeaseStore,
    fenced_transaction,
)
from tests.lease.waiting import wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "billing_activity.py"
DAY = (date.today() - timedelta(days=1)).isoformat()


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("billing_activity_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


example = _example()


def _charges(sink_db: str) -> list[tuple[str, int]]:
    with psycopg.connect(sink_db) as conn:
        rows = conn.execute("SELECT customer, token FROM charges ORDER BY id").fetchall()
    return [(str(c), int(t)) for c, t in rows]


def _charger(fail_at: str | None = None) -> Any:
    def charge(conn: psycopg.Connection[Any], customer: str, idempotency_key: str) -> None:
        if customer == fail_at:
            raise ConnectionError("payment processor timed out")
        token = conn.execute("SELECT token FROM runfence.fence LIMIT 1").fetchone()
        conn.execute(
            "INSERT INTO charges (run_key, customer, token, writer) VALUES (%s, %s, %s, %s)",
            (DAY, customer, token[0] if token else None, idempotency_key),
        )

    return charge


def _attempt(n: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id="billing-wf", attempt=n)
    return env


def test_attempts_of_the_activity_charge_each_customer_once_through_a_failure(
    lease_db: str, sink_db: str
) -> None:
    customers = [f"cust-{n}" for n in range(6)]
    job = example.BillingInput(DAY, customers, lease_db, sink_db)

    def run(fail_at: str | None) -> Any:
        @activity.defn
        def billing(job: Any) -> Any:
            with LeaseStore(job.lease_dsn, ttl=10.0) as store:
                return example.charge_all(
                    store, example.holder_of_this_attempt(), job, _charger(fail_at)
                )

        return billing

    with pytest.raises(ConnectionError):
        _attempt(1).run(run("cust-3"), job)
    assert [c for c, _ in _charges(sink_db)] == customers[:3]
    second = _attempt(2).run(run(None), job)
    assert second["charged"] == 6  # every holder's items, not only attempt 2's 3
    third = _attempt(3).run(run(None), job)
    assert third == second  # the recorded result, nothing charged again

    charged = _charges(sink_db)
    assert sorted(c for c, _ in charged) == customers  # each once
    with LeaseStore(lease_db) as store:
        key = f"billing_nightly/charge/{DAY}"
        history = [(h["event"], h["outcome"], h["holder"]["attempt"]) for h in store.history(key)]
    assert history == [
        ("acquire", "granted", 1),
        ("fail", "failed", 1),
        ("acquire", "granted", 2),
        ("complete", "succeeded", 2),
        ("acquire", "succeeded", 3),
    ]
    # attempt 2 got its own token (it is another holder than attempt 1)
    assert len({t for _, t in charged}) == 2


def test_a_held_key_is_answered_not_raised_and_the_async_form_runs(
    lease_db: str, sink_db: str
) -> None:
    job = example.BillingInput(DAY, ["a", "b"], lease_db, sink_db)
    key = f"billing_nightly/charge/{DAY}"
    with LeaseStore(lease_db, ttl=30.0) as store:
        other = store.acquire(key, Holder.process("another worker")).lease
        held = asyncio.run(example.charge_async(store, Holder.process("async"), job, _charger()))
        assert set(held) == {"held_until"}
        assert _charges(sink_db) == []
        store.release(other)
        done = asyncio.run(example.charge_async(store, Holder.process("async"), job, _charger()))
    assert done["charged"] == 2
    assert sorted(c for c, _ in _charges(sink_db)) == ["a", "b"]


def test_what_the_readme_says_of_items_results_and_an_expired_lease(
    store: LeaseStore, sink_db: str
) -> None:
    key = f"billing_nightly/charge/{DAY}"
    lease = store.acquire(key, Holder.process("late"), ttl=0.2).lease
    wait_for(lambda: (row := store.get(key)) is not None and row["expired"])
    # expired but not taken over: still renewed, written under and completed by its holder
    assert store.renew(lease, ttl=5.0) > datetime.now(UTC)
    with psycopg.connect(sink_db, autocommit=True) as sink:
        with fenced_transaction(sink, key, lease.token) as tx:
            assert tx.claim("cust-1")
            for bad in ("", "x" * 513):
                with pytest.raises(InvalidLeaseInput):
                    tx.claim(bad)
        # results must be JSON: refused before anything is written
        with pytest.raises(InvalidLeaseInput):
            store.complete(lease, {"at": datetime.now(UTC)})
    row = store.get(key)
    assert row is not None
    assert row["state"] == "running"
    store.complete(lease, {"charged": 1})
    row = store.get(key)
    assert row is not None
    assert (row["state"], row["result"]) == ("succeeded", {"charged": 1})


def test_the_readme_shows_the_tested_file() -> None:
    readme = (EXAMPLE.parents[2] / "README.md").read_text()
    section = readme.split("## Using the lease store", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.strip()]
    source = EXAMPLE.read_text().splitlines()
    at = 0
    for line in lines:
        assert line in source[at:], f"the README's line is not in {EXAMPLE.name}: {line!r}"
        at = source.index(line, at) + 1
