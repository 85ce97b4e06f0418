"""One holder of the campaign: a real OS process that works the keys it is sent, in turn.

The campaign forks holders from a fork server that has imported this module (a holder
replacing a killed one starts in milliseconds, not the third of a second of CPU a Python
start and its imports cost), and sends each the keys of its group over a pipe; three holders
of a group work the same keys, as three tries of one task would. A holder lives for many keys
and keeps its connections, through the campaign's proxy (tests/chaos/proxy.py).

Fenced mode takes each key's lease through the public API, keeps it renewed, and writes each
item in its own fenced transaction (skipping items the ledger has), doing the item's work
inside it, then completes the lease; it retries through store and sink errors (the store and
the fence end a call that overruns, a black-holed route or a lost commit answer, on their own
clock: the ledger then decides). Plain mode is the plugin disabled: every item
written, no lease, no fence.

A holder of a processor group (``Config.processor_url``) charges each item at the payment
processor instead, as ``dags/billing_charges.py`` does: through ``ExternalCalls.call`` (or, with
``Config.in_flight`` > 1, ``ExternalCalls.call_many``, that many at the processor at once) with the
stripe SDK's sender (the item's idempotency key, the fence's token headers), its ``record``
writing the item's sink row with the processor's answer; plain, it charges with no key and no
ledger, then writes the row (what the demo's disabled plugin does). The item's work comes after
the processor's answer, before the record: the window in which a frozen or killed holder has
charged and not recorded (the incident's), which the campaign aims its process faults at.

The holder publishes its state in shared memory (idle, lease live, sink transaction live;
the key's number; its sink session's pid), so the campaign can tell, with the holder stopped,
whether a fault landed.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg

from airflow_plugins.lease import (
    Holder,
    Lease,
    LeaseError,
    LeaseKeeper,
    LeaseStore,
    Outcome,
    StaleToken,
    connect_sink,
    fenced_transaction,
)
from airflow_plugins.lease.call_watchdog import WATCHDOG
from airflow_plugins.lease.external_call import (
    CallAnswer,
    CallResult,
    ExternalCalls,
    OutgoingCall,
    ProcessorUnavailable,
    Record,
    RetryPolicy,
)
from airflow_plugins.lease.sink_fence import FencedWrite

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dags"))
import billing_charges  # the DAGs' own stripe sender, as the billing DAG uses it

WRITE = "INSERT INTO effects (key, item, token, writer) VALUES (%s, %s, %s, %s)"
# how long a holder waits for the processor's answer (the campaign's processor_timeout fault
# answers later than this, after making the charge)
PROCESSOR_TIMEOUT = 2.0
# CALL: the item's request is out at the processor; ACCEPTED: it answered, not yet recorded
IDLE, LEASE, TX, CALL, ACCEPTED = 0, 1, 2, 3, 4
FIELDS = 3  # per holder in the shared array: state, key number, sink backend pid


@dataclasses.dataclass(frozen=True)
class Config:
    """What one holder is told at its start."""

    slot: int
    name: str
    sink_dsn: str
    lease_dsn: str  # empty: plain (the plugin disabled)
    items: int
    ttl: float
    item_sleep: float
    key_deadline: float = 60.0
    processor_url: str = ""  # set: this holder charges each item at the payment processor
    in_flight: int = 1  # > 1: charges through ExternalCalls.call_many, that many at a time

    @property
    def plain(self) -> bool:
        """The plugin disabled: no lease, no fence."""
        return not self.lease_dsn


class Sink:
    """The holder's sink connection, reopened when it breaks."""

    def __init__(self, cfg: Config, state: Any) -> None:
        self.cfg = cfg
        self.state = state
        self.conn: psycopg.Connection[Any] | None = None

    def connection(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.drop()
            self.conn = connect_sink(self.cfg.sink_dsn, connect_timeout=1.0)
            self.state[self.cfg.slot * FIELDS + 2] = self.conn.info.backend_pid
        return self.conn

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.state[self.cfg.slot * FIELDS + 2] = 0


def _set(cfg: Config, state: Any, value: int) -> None:
    state[cfg.slot * FIELDS] = value


def _leased_key(
    store: LeaseStore,
    sink: Sink,
    cfg: Config,
    state: Any,
    key: str,
    items: Callable[[Lease, LeaseKeeper], None],
) -> str:
    """Works ``key`` under its lease until it is done: acquire (a held key is asked again),
    ``items`` with the keeper running, complete; superseded or cut off, acquire again."""
    holder = Holder.process(cfg.name)
    end = time.monotonic() + cfg.key_deadline
    while time.monotonic() < end:
        try:
            got = store.acquire(key, holder)
            if got.outcome is Outcome.SUCCEEDED:
                return "succeeded"
            if not got.granted:
                time.sleep(0.05)
                continue
            lease = got.lease
            _set(cfg, state, LEASE)
            try:
                with LeaseKeeper(store, lease) as keeper:
                    items(lease, keeper)
                store.complete(lease, {"items": cfg.items})
                return "completed"
            finally:
                _set(cfg, state, IDLE)
        except StaleToken:
            time.sleep(0.05)  # superseded (at the sink or at the processor): ask again
        except (LeaseError, psycopg.Error):
            sink.drop()
            time.sleep(0.05)
    return "gave_up"


def _fenced_key(store: LeaseStore, sink: Sink, cfg: Config, state: Any, key: str) -> str:
    # the fence's own calls and the commit: a black-holed route or a lost commit answer ends
    # there (the fence's bound, as a task's), and the ledger decides on the retry
    bound = 2 * cfg.ttl

    def items(lease: Lease, keeper: LeaseKeeper) -> None:
        n = 0
        while n < cfg.items:
            keeper.check()
            item = f"item-{n:03d}"
            conn = sink.connection()
            try:
                with fenced_transaction(
                    conn,
                    key,
                    lease.token,
                    idle_timeout=cfg.ttl * 2 / 3,
                    lock_timeout=cfg.ttl,
                    call_timeout=bound,
                ) as tx:
                    _set(cfg, state, TX)
                    if tx.claim(item):
                        conn.execute(WRITE, (key, item, lease.token, cfg.name))
                    time.sleep(cfg.item_sleep)  # the item's work, inside it
            except psycopg.OperationalError:
                sink.drop()  # fate unknown: the ledger decides on the retry
                continue
            finally:
                _set(cfg, state, LEASE)
            n += 1

    return _leased_key(store, sink, cfg, state, key, items)


def _plain_key(sink: Sink, cfg: Config, state: Any, key: str) -> str:
    _set(cfg, state, LEASE)  # "live": writing
    try:
        n = 0
        while n < cfg.items:
            try:
                conn = sink.connection()
                with WATCHDOG.bound(conn, 2.0), conn.transaction():
                    _set(cfg, state, TX)
                    conn.execute(WRITE, (key, f"item-{n:03d}", 0, cfg.name))
                    time.sleep(cfg.item_sleep)
            except psycopg.Error:
                sink.drop()
                time.sleep(0.05)
                continue
            finally:
                _set(cfg, state, LEASE)
            n += 1
        return "completed"
    finally:
        _set(cfg, state, IDLE)


def charge_params(key: str, item: str) -> dict[str, Any]:
    """The PaymentIntent one item's charge creates (the same for every holder of the key).

    ``metadata[run]`` and ``metadata[customer]`` name the item at the processor: the checker
    counts the processor's charges by them.
    """
    return {
        "amount": 1000 + int(item.rsplit("-", 1)[1]),
        "currency": "usd",
        "confirm": True,
        "payment_method": "pm_card_visa",
        "description": f"chaos billing {key}",
        "metadata": {"customer": item, "run": key},
    }


def _sender(cfg: Config, state: Any) -> Any:
    """The stripe SDK's sender (``billing_charges.stripe_sender``), publishing the holder's
    state around it; the item's work follows the processor's answer (the window)."""
    client = billing_charges.stripe_client(cfg.processor_url, timeout=PROCESSOR_TIMEOUT)
    stripe_send = billing_charges.stripe_sender(client)

    def send(call: OutgoingCall) -> CallAnswer:
        _set(cfg, state, CALL)
        answer: CallAnswer = stripe_send(call)
        _set(cfg, state, ACCEPTED)
        time.sleep(cfg.item_sleep)  # the item's work after the charge, before its record
        return answer

    return send


def _processor_key(
    store: LeaseStore, sink: Sink, cfg: Config, state: Any, key: str, send: Any
) -> str:
    bound = 2 * cfg.ttl
    retry = RetryPolicy(attempts=3, first_delay=0.05, max_delay=0.2)

    def items(lease: Lease, keeper: LeaseKeeper) -> None:
        calls = ExternalCalls(
            sink.connection,
            key,
            lease.token,
            idle_timeout=cfg.ttl * 2 / 3,
            lock_timeout=cfg.ttl,
            call_timeout=bound,
            retry=retry,
            check=keeper.check,
        )

        def record(tx: FencedWrite, result: CallResult) -> None:
            tx.conn.execute(WRITE, (key, result.item, tx.token, cfg.name))

        if cfg.in_flight > 1:
            _call_many(calls, sink, cfg, state, key, send, keeper, record)
            return
        n = 0
        while n < cfg.items:
            keeper.check()
            item = f"item-{n:03d}"
            try:
                calls.call(item, charge_params(key, item), send, record=record)
            except psycopg.OperationalError:
                sink.drop()  # fate unknown: the ledger decides on the retry
                continue
            except ProcessorUnavailable:
                time.sleep(0.05)  # the item stays intended: sent again, same key
                continue
            finally:
                _set(cfg, state, LEASE)
            n += 1

    return _leased_key(store, sink, cfg, state, key, items)


def _call_many(
    calls: ExternalCalls,
    sink: Sink,
    cfg: Config,
    state: Any,
    key: str,
    send: Any,
    keeper: LeaseKeeper,
    record: Record,
) -> None:
    """Every item of the key through ``call_many`` until it returns: after an error the items
    recorded are answered from the ledger, the rest (intended, claimed ahead or cut off) are
    sent again with their keys."""
    todo = [(f"item-{n:03d}", charge_params(key, f"item-{n:03d}")) for n in range(cfg.items)]
    while True:
        keeper.check()
        try:
            calls.call_many(todo, send, record=record, in_flight=cfg.in_flight)
            return
        except psycopg.OperationalError:
            sink.drop()  # fate unknown: the ledger decides on the retry
        except ProcessorUnavailable:
            time.sleep(0.05)  # the items stay intended: sent again, same keys
        finally:
            _set(cfg, state, LEASE)


def _plain_processor_key(sink: Sink, cfg: Config, state: Any, key: str, send: Any) -> str:
    """The plugin disabled: charge with no idempotency key and no ledger, then write the row."""
    _set(cfg, state, LEASE)  # "live": working
    try:
        n = 0
        while n < cfg.items:
            item = f"item-{n:03d}"
            try:
                send(OutgoingCall(key, item, 0, None, charge_params(key, item)))
                conn = sink.connection()
                with WATCHDOG.bound(conn, 2.0), conn.transaction():
                    conn.execute(WRITE, (key, item, 0, cfg.name))
            except (psycopg.Error, ProcessorUnavailable):
                sink.drop()
                time.sleep(0.05)
                continue
            finally:
                _set(cfg, state, LEASE)
            n += 1
        return "completed"
    finally:
        _set(cfg, state, IDLE)


def serve(cfg: Config, pipe: Connection, state: Any) -> None:
    """Works each (key, number) received until told None; answers (key, outcome) for each."""
    # the keeper's and the fence's warnings would flood the campaign's output: the checker
    # judges the outcome from the sink
    logging.disable(logging.CRITICAL)
    sink = Sink(cfg, state)
    store = None
    if not cfg.plain:
        store = LeaseStore(
            cfg.lease_dsn, ttl=cfg.ttl, connect_timeout=1.0, call_timeout=cfg.ttl, pool_size=2
        )
    send = _sender(cfg, state) if cfg.processor_url else None
    while True:
        try:
            got = pipe.recv()
        except EOFError:
            return
        if got is None:
            return
        key, number = got
        state[cfg.slot * FIELDS + 1] = number
        if send is not None and store is None:
            outcome = _plain_processor_key(sink, cfg, state, key, send)
        elif send is not None:
            assert store is not None
            outcome = _processor_key(store, sink, cfg, state, key, send)
        elif store is None:
            outcome = _plain_key(sink, cfg, state, key)
        else:
            outcome = _fenced_key(store, sink, cfg, state, key)
        pipe.send((key, outcome))
