"""The external-call API on real components: the lease store, the sink, the processor, the SDK.

Each test counts what a user would count: the charges the payment processor made, and what the
sink's ledger recorded for each customer. No Airflow here (lease level).
"""

from __future__ import annotations

import hashlib
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_plugins.demo.processor import PaymentProcessor
from airflow_plugins.lease import (
    LEASE_STORE,
    SINK_FENCE,
    Holder,
    InvalidLeaseInput,
    Lease,
    LeaseStore,
    StaleToken,
    migrate,
)
from airflow_plugins.lease.external_call import (
    CallAnswer,
    ExternalCalls,
    MalformedAnswer,
    NeedsReconciliation,
    OutgoingCall,
    ProcessorRefusedToken,
    ProcessorUnavailable,
    RetryPolicy,
    recorded_calls,
)
from airflow_plugins.lease.fence import Fence
from tests.conftest import create_database, drop_database
from tests.lease.waiting import wait_for

DAGS = Path(__file__).resolve().parents[2] / "dags"
sys.path.insert(0, str(DAGS))
import billing_charges  # noqa: E402

KEY = "billing_nightly/charge/2024-02-15"
DAY = "2024-02-15"
PARAMS_1 = billing_charges.charge_params(DAY, "cust-0001")
FAST = RetryPolicy(attempts=4, first_delay=0.01, max_delay=0.05)


# One lease store and one sink for the module (a database per test costs seconds to drop on a
# busy server); each test has a key of its own, so none sees another's rows.
@pytest.fixture(scope="module")
def sink_db() -> Iterator[str]:
    dsn = create_database("eosink")
    migrate(dsn, SINK_FENCE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE charges (id bigserial PRIMARY KEY, run_key text NOT NULL, "
            "customer text NOT NULL, token bigint, writer text)"
        )
    yield dsn
    drop_database(dsn)


@pytest.fixture(scope="module")
def store() -> Iterator[LeaseStore]:
    dsn = create_database()
    migrate(dsn, LEASE_STORE)
    with LeaseStore(dsn, ttl=5.0) as s:
        yield s
    drop_database(dsn)


@pytest.fixture(autouse=True)
def _own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sys.modules[__name__], "KEY", f"billing_{uuid.uuid4().hex[:8]}/charge/{DAY}"
    )


@pytest.fixture
def processor() -> Iterator[PaymentProcessor]:
    with PaymentProcessor() as p:
        yield p


def holder(store: LeaseStore, name: str) -> Lease:
    """A lease on KEY for ``name`` ("a": a short one, soon expired), taken over from an
    earlier holder once that one's lease has expired."""
    ttl = 0.3 if name == "a" else 30.0

    def granted() -> Lease | None:
        got = store.acquire(KEY, Holder.process(name), ttl=ttl)
        return got.lease if got.granted else None

    return wait_for(granted, timeout=10, every=0.1)


OPEN: list[psycopg.Connection[Any]] = []


@pytest.fixture(autouse=True)
def _close_connections(sink_db: str) -> Iterator[None]:
    # before the sink database is dropped: a forced drop waits for the sessions it ends
    yield
    while OPEN:
        OPEN.pop().close()


def calls(sink_db: str, lease: Lease, **kw: Any) -> ExternalCalls:
    """A holder's external calls on its own sink connection (closed after the test)."""
    conn = psycopg.connect(sink_db, autocommit=True)
    OPEN.append(conn)
    return ExternalCalls(
        lambda: conn, lease.key, lease.token, retry=FAST, generation=lease.generation, **kw
    )


def charge(
    ext: ExternalCalls, customer: str, url: str, *, timeout: float = 5.0, lookup: bool = False
) -> Any:
    client = billing_charges.stripe_client(url, timeout=timeout)
    return ext.call(
        customer,
        billing_charges.charge_params(DAY, customer),
        billing_charges.stripe_sender(client),
        lookup=billing_charges.stripe_lookup(client) if lookup else None,
        record=record_charge,
    )


def record_charge(tx: Any, result: Any) -> None:
    tx.conn.execute(
        "INSERT INTO charges (run_key, customer, token, writer) VALUES (%s, %s, %s, %s)",
        (tx.key, result.item, tx.token, result.reference or result.state),
    )


def per_customer(processor: PaymentProcessor) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in processor.charges():
        counts[c["customer"]] = counts.get(c["customer"], 0) + 1
    return counts


def ledger(sink_db: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(sink_db, autocommit=True) as conn:
        return {r["item"]: r for r in recorded_calls(conn, [KEY])}


def test_each_customer_is_charged_once_and_its_charge_id_recorded(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    lease = holder(store, "b")
    ext = calls(sink_db, lease)
    names = [f"cust-{i:04d}" for i in range(1, 6)]
    first = [charge(ext, c, processor.url) for c in names]
    again = [charge(ext, c, processor.url) for c in names]  # a retry of the whole body
    assert all(r.sent and r.state == "accepted" for r in first)
    assert not any(r.sent for r in again)
    assert per_customer(processor) == dict.fromkeys(names, 1)
    recorded = ledger(sink_db)
    assert {c: recorded[c]["reference"] for c in names} == {
        c["customer"]: c["id"] for c in processor.charges()
    }
    keys = {c["idempotency_key"] for c in processor.charges()}
    assert keys == {recorded[c]["idempotency_key"] for c in names}


def test_a_holder_frozen_after_the_processor_accepted_is_replayed_not_charged_again(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    a = holder(store, "a")
    accepted, resume = threading.Event(), threading.Event()
    real = billing_charges.stripe_sender(billing_charges.stripe_client(processor.url))

    def frozen_after_send(call: OutgoingCall) -> CallAnswer:
        answer = real(call)
        accepted.set()
        resume.wait(30)  # the processor has charged; the answer is not recorded yet
        return answer

    old = calls(sink_db, a)
    errors: list[BaseException] = []

    def run_a() -> None:
        try:
            old.call("cust-0001", PARAMS_1, frozen_after_send)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_a)
    thread.start()
    assert accepted.wait(30)
    b = holder(store, "b")
    taken = charge(calls(sink_db, b), "cust-0001", processor.url)
    resume.set()
    thread.join(30)
    assert taken.state == "accepted"
    assert taken.reference == processor.charges()[0]["id"]  # the replayed first answer
    assert [type(e) for e in errors] == [StaleToken]  # the frozen holder's record is refused
    assert per_customer(processor) == {"cust-0001": 1}
    assert ledger(sink_db)["cust-0001"]["sends"] == 2


@pytest.mark.parametrize("kind", ["idempotency", "tokens"])
def test_a_late_request_is_replayed_or_refused(store: LeaseStore, sink_db: str, kind: str) -> None:
    with PaymentProcessor(idempotency=kind == "idempotency", check_tokens=kind == "tokens") as p:
        a = holder(store, "a")
        old = calls(sink_db, a)
        intended = old.outgoing("cust-0001", billing_charges.charge_params(DAY, "cust-0001"))
        old._claim([intended])  # claimed, then frozen before it sent
        b = holder(store, "b")
        done = charge(calls(sink_db, b), "cust-0001", p.url, lookup=kind == "tokens")
        assert done.state == "accepted"
        late = billing_charges.stripe_sender(billing_charges.stripe_client(p.url))
        if kind == "idempotency":
            replay = late(intended)  # the frozen holder's request, sent at last
            assert replay.reference == done.reference
        else:
            with pytest.raises(ProcessorRefusedToken):
                late(intended)
            assert p.refused()[0]["token"] == a.token
        assert per_customer(p) == {"cust-0001": 1}


def test_timeout_after_the_charge_and_500s_end_with_one_charge_each(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    processor.faults.add("timeout_after_commit", customers=["cust-0001"], delay=1.5)
    processor.faults.add("error_500", customers=["cust-0002"], times=2)
    ext = calls(sink_db, holder(store, "b"))
    results = [charge(ext, c, processor.url, timeout=0.5) for c in ("cust-0001", "cust-0002")]
    assert [r.state for r in results] == ["accepted", "accepted"]
    assert per_customer(processor) == {"cust-0001": 1, "cust-0002": 1}
    assert {c: r["state"] for c, r in ledger(sink_db).items()} == {
        "cust-0001": "accepted",
        "cust-0002": "accepted",
    }


def test_a_declined_card_is_the_items_outcome_not_retried_not_charged(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    processor.faults.add("declined", customers=["cust-0002"], times=None)
    ext = calls(sink_db, holder(store, "b"))
    sent = [charge(ext, c, processor.url) for c in ("cust-0001", "cust-0002", "cust-0003")]
    again = charge(ext, "cust-0002", processor.url)
    assert [r.state for r in sent] == ["accepted", "declined", "accepted"]
    assert sent[1].detail["reason"] == "card_declined"
    assert not again.sent
    assert again.state == "declined"
    assert per_customer(processor) == {"cust-0001": 1, "cust-0003": 1}
    assert ledger(sink_db)["cust-0002"]["state"] == "declined"


def test_a_malformed_answer_is_a_clear_error_and_the_item_is_charged_once_later(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    processor.faults.add("malformed")
    ext = calls(sink_db, holder(store, "b"))
    with pytest.raises(MalformedAnswer, match="not JSON"):
        charge(ext, "cust-0001", processor.url)
    assert ledger(sink_db)["cust-0001"]["state"] == "intended"  # not skipped, not charged
    assert charge(ext, "cust-0001", processor.url).state == "accepted"  # the replay
    assert per_customer(processor) == {"cust-0001": 1}


def test_a_processor_that_is_down_defers_the_item_never_skips_it(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    ext = calls(sink_db, holder(store, "b"))
    processor.stop()
    with pytest.raises(ProcessorUnavailable):
        charge(ext, "cust-0001", processor.url)
    assert ledger(sink_db)["cust-0001"]["state"] == "intended"
    processor.start()
    assert charge(ext, "cust-0001", processor.url).state == "accepted"
    assert per_customer(processor) == {"cust-0001": 1}


def test_a_token_processor_without_idempotency_is_reconciled_by_lookup(
    store: LeaseStore, sink_db: str
) -> None:
    with PaymentProcessor(idempotency=False, check_tokens=True) as p:
        a = holder(store, "a")
        real = billing_charges.stripe_sender(billing_charges.stripe_client(p.url))
        crash = RuntimeError("crashed after the processor accepted")

        def accepted_then_crash(call: OutgoingCall) -> CallAnswer:
            real(call)
            raise crash

        with pytest.raises(RuntimeError):
            calls(sink_db, a).call("cust-0001", PARAMS_1, accepted_then_crash)
        done = charge(calls(sink_db, holder(store, "b")), "cust-0001", p.url, lookup=True)
        assert not done.sent  # found at the processor, recorded, not charged again
        assert done.reference == p.charges()[0]["id"]
        assert per_customer(p) == {"cust-0001": 1}


def test_an_intent_older_than_the_replay_window_needs_reconciliation(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    ext = calls(sink_db, holder(store, "b"), replay_window_s=0.0)
    ext._claim([ext.outgoing("cust-0001", billing_charges.charge_params(DAY, "cust-0001"))])
    with pytest.raises(NeedsReconciliation, match="check the processor"):
        charge(ext, "cust-0001", processor.url)
    assert processor.charges() == []


def test_an_item_intended_with_other_parameters_is_refused(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    ext = calls(sink_db, holder(store, "b"))
    ext._claim([ext.outgoing("cust-0001", {"amount": 1, "currency": "usd"})])
    with pytest.raises(InvalidLeaseInput, match="other parameters"):
        charge(ext, "cust-0001", processor.url)
    assert processor.charges() == []


def test_shadow_calls_send_nothing_and_record_what_they_would_send(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    lease = holder(store, "b")
    ext = calls(sink_db, lease, shadow=True, idempotency_scope=KEY)
    got = charge(ext, "cust-0001", processor.url)
    assert got.state == "shadow"
    assert processor.charges() == []
    assert ledger(sink_db) == {}
    primary = calls(sink_db, lease).outgoing("cust-0001", PARAMS_1)
    assert ext.would_send == [
        {"item": "cust-0001", "idempotency_key": primary.idempotency_key, "params": primary.params}
    ]


def test_without_protection_two_executions_charge_twice(
    sink_db: str, processor: PaymentProcessor
) -> None:
    # what the incident had: plain code sends no idempotency key and keeps no ledger
    client = billing_charges.stripe_client(processor.url)
    for _ in range(2):
        fence = Fence.unprotected(KEY, DAY, lambda: psycopg.connect(sink_db, autocommit=True))
        fence.external_call(
            "cust-0001",
            billing_charges.charge_params(DAY, "cust-0001"),
            billing_charges.stripe_sender(client),
            record=record_charge,
        )
        fence.close()
    assert per_customer(processor) == {"cust-0001": 2}


@pytest.mark.parametrize(("lookup", "expected"), [(True, 1), (False, 2)])
def test_a_processor_with_neither_after_a_timeout_is_reconciled_only_by_lookup(
    store: LeaseStore, sink_db: str, lookup: bool, expected: int
) -> None:
    # it charged, then timed out: without idempotency keys only a lookup before the retry
    # tells; without one the retry charges again (the README's "neither" case)
    with PaymentProcessor(idempotency=False) as p:
        p.faults.add("timeout_after_commit", delay=1.5)
        ext = calls(sink_db, holder(store, "b"))
        done = charge(ext, "cust-0001", p.url, timeout=0.5, lookup=lookup)
        assert done.state == "accepted"
        assert done.sent is not lookup  # found by the lookup, not sent again
        assert per_customer(p) == {"cust-0001": expected}


def test_an_approved_rerun_charges_each_customer_once_more_and_only_once(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    names = ["cust-0001", "cust-0002"]
    first = holder(store, "b")
    for c in names:
        charge(calls(sink_db, first), c, processor.url)
    store.complete(first, {"charged": len(names)})
    store.approve_rerun(KEY, actor="alice", reason="INC-42 re-bill")
    rerun = holder(store, "c")
    assert rerun.generation == 1
    results = [charge(calls(sink_db, rerun), c, processor.url) for c in names]
    retried = [charge(calls(sink_db, rerun), c, processor.url) for c in names]  # its retry
    assert all(r.sent and r.state == "accepted" for r in results)
    assert not any(r.sent for r in retried)
    assert per_customer(processor) == dict.fromkeys(names, 2)
    keys = [c["idempotency_key"] for c in processor.charges()]
    assert len(set(keys)) == 4  # the re-run's keys are its own: no replay of the first charge


def test_idempotency_keys_are_their_generations_own_and_never_collide() -> None:
    from airflow_plugins.lease import FencedWrite, idempotency_key

    # generation 0 keeps the form keys recorded before re-runs existed
    assert idempotency_key(KEY, "a") == hashlib.sha256(f"{KEY}\x1fa".encode()).hexdigest()
    keys = {
        idempotency_key(KEY, item, generation)
        for item in ("a", "a#1", "a\x1e1", "a\x1d1", "1\x1da")
        for generation in (0, 1, 2, 11)
    }
    assert len(keys) == 20
    headers = FencedWrite(None, KEY, 7, generation=1).headers("a")  # type: ignore[arg-type]
    assert headers["Idempotency-Key"] == idempotency_key(KEY, "a", 1)


# -- call_many: several calls in flight, claims and records batched -------------------------


def charge_many(
    ext: ExternalCalls, customers: list[str], send: Any, *, in_flight: int = 8
) -> list[Any]:
    return ext.call_many(
        [(c, billing_charges.charge_params(DAY, c)) for c in customers],
        send,
        record=record_charge,
        in_flight=in_flight,
    )


def sink_rows(sink_db: str) -> dict[str, int]:
    with psycopg.connect(sink_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT customer, count(*) FROM charges WHERE run_key = %s GROUP BY customer", (KEY,)
        ).fetchall()
    return dict(rows)


def test_many_in_flight_charge_each_customer_once_and_record_each(
    store: LeaseStore, sink_db: str
) -> None:
    names = [f"cust-{i:04d}" for i in range(1, 41)]
    busy, most = 0, 0
    lock = threading.Lock()
    with PaymentProcessor(latency=0.05) as p:
        real = billing_charges.stripe_sender(billing_charges.stripe_client(p.url))

        def counted(call: OutgoingCall) -> CallAnswer:
            nonlocal busy, most
            with lock:
                busy += 1
                most = max(most, busy)
            try:
                return real(call)
            finally:
                with lock:
                    busy -= 1

        ext = calls(sink_db, holder(store, "b"))
        first = charge_many(ext, names, counted)
        again = charge_many(ext, names, counted)  # a retry of the whole body
        assert [r.item for r in first] == names  # in the order given
        assert all(r.sent and r.state == "accepted" for r in first)
        assert not any(r.sent for r in again)
        assert per_customer(p) == dict.fromkeys(names, 1)
        assert {r.item: r.reference for r in first} == {c["customer"]: c["id"] for c in p.charges()}
    assert 1 < most <= 8  # the calls were at the processor together, never more than 8
    assert sink_rows(sink_db) == dict.fromkeys(names, 1)
    assert {c: r["state"] for c, r in ledger(sink_db).items()} == dict.fromkeys(names, "accepted")


def test_a_holder_frozen_with_calls_in_flight_is_taken_over_each_charged_once(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    names = [f"cust-{i:04d}" for i in range(1, 25)]
    real = billing_charges.stripe_sender(billing_charges.stripe_client(processor.url))
    accepted, resume = threading.Event(), threading.Event()

    def frozen_after_send(call: OutgoingCall) -> CallAnswer:
        answer = real(call)
        if call.item >= "cust-0009":  # the first items are recorded; the rest freeze
            accepted.set()
            resume.wait(30)  # the processor has charged; the answer is not recorded yet
        return answer

    old = calls(sink_db, holder(store, "a"))
    errors: list[BaseException] = []

    def run_a() -> None:
        try:
            charge_many(old, names, frozen_after_send)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_a)
    thread.start()
    assert accepted.wait(30)
    new = calls(sink_db, holder(store, "b"))
    taken = charge_many(new, names, real)
    resume.set()
    thread.join(30)
    assert [type(e) for e in errors] == [StaleToken]  # the frozen holder's records refused
    assert [r.state for r in taken] == ["accepted"] * len(names)
    assert per_customer(processor) == dict.fromkeys(names, 1)
    assert sink_rows(sink_db) == dict.fromkeys(names, 1)
    replayed = {c for c, r in ledger(sink_db).items() if r["sends"] == 2}
    assert replayed  # the taken-over items were sent again, with their keys: replayed
    assert replayed <= {c for c in names if c >= "cust-0009"}


def test_one_failing_call_stops_the_batch_and_nothing_is_missed_later(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    names = [f"cust-{i:04d}" for i in range(1, 31)]
    processor.faults.add("error_500", customers=["cust-0005"], times=None)  # down for it
    send = billing_charges.stripe_sender(billing_charges.stripe_client(processor.url))
    ext = calls(sink_db, holder(store, "b"))
    with pytest.raises(ProcessorUnavailable):
        charge_many(ext, names, send, in_flight=4)
    states = {c: r["state"] for c, r in ledger(sink_db).items()}
    assert states["cust-0005"] == "intended"  # deferred, not skipped
    charged = per_customer(processor)
    # what was charged is recorded; what is intended (claimed ahead, then not sent after the
    # failure) was not charged
    assert set(charged) == {c for c, state in states.items() if state == "accepted"}
    assert set(states.values()) <= {"accepted", "intended"}
    processor.faults.clear()
    done = charge_many(ext, names, send, in_flight=4)  # the task's next try
    assert [r.state for r in done] == ["accepted"] * len(names)
    assert per_customer(processor) == dict.fromkeys(names, 1)
    assert sink_rows(sink_db) == dict.fromkeys(names, 1)


def test_call_many_refuses_bad_input_before_sending(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    send = billing_charges.stripe_sender(billing_charges.stripe_client(processor.url))
    ext = calls(sink_db, holder(store, "b"))
    with pytest.raises(InvalidLeaseInput, match="listed twice"):
        charge_many(ext, ["cust-0001", "cust-0002", "cust-0001"], send)
    with pytest.raises(InvalidLeaseInput, match="in_flight"):
        charge_many(ext, ["cust-0001"], send, in_flight=0)
    assert processor.charges() == []
    assert ledger(sink_db) == {}


def test_shadow_call_many_sends_nothing_and_records_what_it_would_send(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor
) -> None:
    lease = holder(store, "b")
    ext = calls(sink_db, lease, shadow=True, idempotency_scope=KEY)
    send = billing_charges.stripe_sender(billing_charges.stripe_client(processor.url))
    got = charge_many(ext, ["cust-0001", "cust-0002"], send)
    assert [r.state for r in got] == ["shadow", "shadow"]
    assert processor.charges() == []
    assert ledger(sink_db) == {}
    assert [w["item"] for w in ext.would_send] == ["cust-0001", "cust-0002"]


def test_fence_external_call_many_unprotected_charges_plainly(
    sink_db: str, processor: PaymentProcessor
) -> None:
    # protection off: the plain calls, no key, no ledger (twice run, twice charged)
    send = billing_charges.stripe_sender(billing_charges.stripe_client(processor.url))
    names = ["cust-0001", "cust-0002", "cust-0003"]
    for _ in range(2):
        fence = Fence.unprotected(KEY, DAY, lambda: psycopg.connect(sink_db, autocommit=True))
        got = fence.external_call_many(
            [(c, billing_charges.charge_params(DAY, c)) for c in names], send, record=record_charge
        )
        fence.close()
        assert [r.item for r in got] == names
    assert per_customer(processor) == dict.fromkeys(names, 2)
    assert sink_rows(sink_db) == dict.fromkeys(names, 2)


@pytest.mark.parametrize("with_lookup", [True, False])
def test_with_lookup_no_item_is_claimed_ahead_of_a_free_slot(
    store: LeaseStore, sink_db: str, with_lookup: bool
) -> None:
    # a processor that may not replay by key: a holder frozen past its lease must hold no more
    # claimed, unsent items than it has slots (each is a charge its lookup-less window allows)
    names = [f"cust-{i:04d}" for i in range(1, 21)]
    most = 0
    lock = threading.Lock()
    watch = psycopg.connect(sink_db, autocommit=True)
    OPEN.append(watch)
    with PaymentProcessor(latency=0.05, idempotency=not with_lookup, check_tokens=True) as p:
        client = billing_charges.stripe_client(p.url)
        real = billing_charges.stripe_sender(client)

        def watched(call: OutgoingCall) -> CallAnswer:
            nonlocal most
            with lock:
                (intended,) = watch.execute(
                    "SELECT count(*) FROM runfence.external_call "
                    "WHERE key = %s AND state = 'intended'",
                    (KEY,),
                ).fetchone() or (0,)
                most = max(most, int(intended))
            return real(call)

        ext = calls(sink_db, holder(store, "b"))
        done = ext.call_many(
            [(c, billing_charges.charge_params(DAY, c)) for c in names],
            watched,
            lookup=billing_charges.stripe_lookup(client) if with_lookup else None,
            in_flight=4,
        )
        assert [r.state for r in done] == ["accepted"] * len(names)
        assert per_customer(p) == dict.fromkeys(names, 1)
    if with_lookup:
        assert most <= 4
    else:
        assert most > 4  # claimed one batch ahead (a processor replaying by key makes it safe)
