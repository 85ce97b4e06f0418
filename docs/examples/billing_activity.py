"""A billing step on the lease store outside Airflow, as a plain Temporal activity: the README's
"Using the lease store", made a file that ``tests/lease/test_readme_example.py`` imports and runs
against a real Postgres, so it cannot drift from the API.

What it shows that the short example does not:

* ``Holder.temporal(...)`` from the activity's own info: each attempt is its own holder (with
  ``Holder.process`` every attempt in one worker would be "the same holder" and get the same
  token back);
* items given to ``tx.claim`` are strings of 1 to 512 characters;
* the failure path: an error fails the lease (the next attempt is granted a new token and the
  ledger skips what was done); ``LeaseLost`` (or ``StaleToken``) means another holder has the key
  now: stop, record nothing, do not fail a lease that is not yours;
* a ``held`` answer is returned, not raised, so an engine with a fixed retry budget waits for it
  on a durable timer instead of spending attempts;
* results must be JSON (``complete`` refuses anything else, before writing);
* an async activity calls the synchronous API through ``asyncio.to_thread`` (``charge_async``),
  so the event loop is never blocked.

A lease that expired but was not taken over can still be renewed, written under and completed
by its holder: expiry only lets another holder take over; until one does, nothing is refused
(the keeper counts the lease lost from its own clock, which is the safe side).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from datetime import date
from typing import Any

import psycopg

from airflow_plugins.lease import (
    Holder,
    LeaseKeeper,
    LeaseLost,
    LeaseStore,
    LeaseStoreUnavailable,
    StaleToken,
    advance_fence,
    done_items,
    fenced_transaction,
)

Charge = Callable[[psycopg.Connection[Any], str, str], None]


@dataclasses.dataclass(frozen=True)
class BillingInput:
    """One business date's billing: the customers (each a ledger item) and where to write."""

    business_date: str
    customers: list[str]
    lease_dsn: str
    sink_dsn: str


def holder_of_this_attempt() -> Holder:
    """The holder of the running Temporal activity attempt."""
    from temporalio import activity

    info = activity.info()
    if info.workflow_id is None or info.workflow_run_id is None:
        raise RuntimeError("a billing attempt runs inside a workflow")
    return Holder.temporal(
        workflow_id=info.workflow_id,
        workflow_run_id=info.workflow_run_id,
        activity_id=info.activity_id,
        attempt=info.attempt,
    )


def charge_all(
    store: LeaseStore, holder: Holder, job: BillingInput, charge: Charge
) -> dict[str, Any]:
    """Charges every customer of ``job`` once, whoever ran before; returns the JSON result.

    Returns ``{"held_until": ...}`` when a live holder has the key: wait (a durable timer)
    and call again.

    Raises:
        LeaseLost: another holder has the key now; this one recorded nothing.
        LeaseStoreUnavailable: no lease, no work; retry later.
    """
    day = date.fromisoformat(job.business_date)
    key = f"billing_nightly/charge/{job.business_date}"
    got = store.acquire(key, holder, business_date=day, input={"customers": len(job.customers)})
    if got.outcome == "succeeded":
        return dict(got.result)  # done before: the recorded result
    if got.outcome == "held":
        assert got.expires_at is not None
        return {"held_until": got.expires_at.isoformat()}
    if not got.granted:
        raise RuntimeError(f"{key} refused: {got.detail}")  # past the retention horizon
    lease = got.lease
    try:
        with psycopg.connect(job.sink_dsn, autocommit=True) as sink:
            advance_fence(sink, lease.key, lease.token)  # older holders are refused from now on
            with LeaseKeeper(store, lease) as keeper:
                for customer in job.customers:
                    keeper.check()  # raises LeaseLost once the lease is lost
                    with fenced_transaction(
                        sink, lease.key, lease.token, generation=lease.generation
                    ) as tx:
                        if tx.claim(customer):  # False: an earlier holder charged it
                            charge(tx.conn, customer, tx.headers(customer)["Idempotency-Key"])
                done = done_items(sink, lease.key, lease.generation)  # by every holder
    except (LeaseLost, StaleToken):
        raise  # superseded: the new holder finishes from the ledger
    except BaseException as exc:
        with contextlib.suppress(LeaseLost, LeaseStoreUnavailable):
            store.fail(lease, f"{type(exc).__name__}: {exc}")  # the next attempt gets a new token
        raise
    result = {"charged": len(done), "token": lease.token}  # JSON only
    store.complete(lease, result)
    return result


async def charge_async(
    store: LeaseStore, holder: Holder, job: BillingInput, charge: Charge
) -> dict[str, Any]:
    """``charge_all`` from an async activity: in a worker thread, the event loop stays free."""
    return await asyncio.to_thread(charge_all, store, holder, job, charge)
