"""The external-call API against token-checking processors, with the fence's one-statement steps.

The idempotency-key processor's faults are in ``test_external_call.py``; here the processor
checks ``X-Fencing-Token`` per lease key (Kleppmann's resource), with its idempotency keys
(``tokens``) and without them (``tokens-only``, reconciled by ``lookup``, as the README says it
must be). Each test counts what a user would: the charges at the processor and the outcome the
sink's ledger records per customer. Then the fence's own steps (one statement each): a
superseded token is refused before anything is sent, an older holder frozen in its fenced
transaction is ended, and 8 calls in flight under one key charge each customer once.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
    fenced_transaction,
    migrate,
)
from airflow_plugins.lease.external_call import (
    CallAnswer,
    CallResult,
    ExternalCalls,
    MalformedAnswer,
    OutgoingCall,
    ProcessorRefusedToken,
    ProcessorUnavailable,
    RetryPolicy,
    recorded_calls,
)
from tests.conftest import create_database, drop_database
from tests.lease.waiting import wait_for

DAGS = Path(__file__).resolve().parents[2] / "dags"
sys.path.insert(0, str(DAGS))
import billing_charges  # noqa: E402

DAY = "2024-02-15"
CUSTOMERS = ["cust-0001", "cust-0002", "cust-0003"]
FAST = RetryPolicy(attempts=4, first_delay=0.01, max_delay=0.05)
ONCE = RetryPolicy(attempts=1)  # a holder that gives up at the first unavailable answer
KINDS = ["tokens", "tokens-only"]


@pytest.fixture(scope="module")
def sink_db() -> Iterator[str]:
    dsn = create_database("eosink")
    migrate(dsn, SINK_FENCE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE charges (id bigserial PRIMARY KEY, run_key text NOT NULL, "
            "customer text NOT NULL, token bigint, outcome text, reference text)"
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


@pytest.fixture
def key() -> str:
    return f"billing_{uuid.uuid4().hex[:8]}/charge/{DAY}"


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def processor(kind: str) -> Iterator[PaymentProcessor]:
    with PaymentProcessor(idempotency=kind == "tokens", check_tokens=True) as p:
        yield p


OPEN: list[psycopg.Connection[Any]] = []


@pytest.fixture(autouse=True)
def _close_connections(sink_db: str) -> Iterator[None]:
    yield  # before the sink database is dropped: a forced drop waits for the sessions it ends
    while OPEN:
        OPEN.pop().close()


def sink(sink_db: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(sink_db, autocommit=True)
    OPEN.append(conn)
    return conn


def holder(store: LeaseStore, key: str, name: str) -> Lease:
    """``name``'s lease on ``key`` ("a": a short one, soon expired), once it can be had."""
    ttl = 0.3 if name == "a" else 30.0

    def granted() -> Lease | None:
        got = store.acquire(key, Holder.process(name), ttl=ttl)
        return got.lease if got.granted else None

    return wait_for(granted, timeout=10, every=0.1)


def calls(sink_db: str, lease: Lease, retry: RetryPolicy = FAST, **kw: Any) -> ExternalCalls:
    conn = sink(sink_db)
    return ExternalCalls(
        lambda: conn, lease.key, lease.token, retry=retry, generation=lease.generation, **kw
    )


def charge(
    ext: ExternalCalls, customer: str, url: str, kind: str, *, timeout: float = 5.0
) -> CallResult:
    """One customer's charge as the billing DAG makes it; the token-only processor is
    reconciled by lookup (it does not replay by idempotency key)."""
    client = billing_charges.stripe_client(url, timeout=timeout)
    return ext.call(
        customer,
        billing_charges.charge_params(DAY, customer),
        billing_charges.stripe_sender(client),
        lookup=billing_charges.stripe_lookup(client) if kind == "tokens-only" else None,
        record=record_charge,
    )


def record_charge(tx: Any, result: CallResult) -> None:
    tx.conn.execute(
        "INSERT INTO charges (run_key, customer, token, outcome, reference) "
        "VALUES (%s, %s, %s, %s, %s)",
        (tx.key, result.item, tx.token, result.state, result.reference),
    )


def charged(p: PaymentProcessor) -> Counter[str]:
    return Counter(c["customer"] for c in p.charges())


def intents(p: PaymentProcessor) -> Counter[str]:
    """PaymentIntents the processor created per customer (declined ones included)."""
    with urllib.request.urlopen(f"{p.url}/v1/payment_intents?limit=100", timeout=10) as got:
        page = json.loads(got.read())
    return Counter(i["metadata"]["customer"] for i in page["data"])


def outcomes(sink_db: str, key: str) -> dict[str, str]:
    with psycopg.connect(sink_db, autocommit=True) as conn:
        return {r["item"]: r["state"] for r in recorded_calls(conn, [key])}


def billing_rows(sink_db: str, key: str) -> Counter[tuple[str, str]]:
    with psycopg.connect(sink_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT customer, outcome FROM charges WHERE run_key = %s", (key,)
        ).fetchall()
    return Counter((r[0], r[1]) for r in rows)


# -- the processor's faults, token-checking -----------------------------------------------------


def test_timeouts_after_the_charge_and_500s_end_with_one_charge_each(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor, kind: str, key: str
) -> None:
    processor.faults.add("timeout_after_commit", customers=["cust-0001"], delay=1.5)
    processor.faults.add("error_500", customers=["cust-0002"], times=2)
    ext = calls(sink_db, holder(store, key, "b"))
    results = [charge(ext, c, processor.url, kind, timeout=0.5) for c in CUSTOMERS]
    assert [r.state for r in results] == ["accepted"] * 3
    assert charged(processor) == Counter(CUSTOMERS)
    assert outcomes(sink_db, key) == dict.fromkeys(CUSTOMERS, "accepted")
    assert billing_rows(sink_db, key) == Counter((c, "accepted") for c in CUSTOMERS)
    assert processor.refused() == []


@pytest.mark.parametrize("fault", ["timeout_after_commit", "error_500"])
def test_a_takeover_after_an_ambiguous_answer_charges_once_and_refuses_the_old_holder(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor, kind: str, key: str, fault: str
) -> None:
    # the old holder's call timed out after the processor charged (or got a 500: nothing
    # made) and it gave up; a new holder takes the key over and bills the night
    processor.faults.add(fault, customers=["cust-0001"], delay=1.5)
    a = holder(store, key, "a")
    old = calls(sink_db, a, retry=ONCE)
    with pytest.raises(ProcessorUnavailable):
        charge(old, "cust-0001", processor.url, kind, timeout=0.5)
    made = 1 if fault == "timeout_after_commit" else 0
    assert charged(processor)["cust-0001"] == made
    b = holder(store, key, "b")
    new = calls(sink_db, b)
    results = {c: charge(new, c, processor.url, kind) for c in CUSTOMERS}
    assert {c: r.state for c, r in results.items()} == dict.fromkeys(CUSTOMERS, "accepted")
    assert charged(processor) == Counter(CUSTOMERS)  # one each: none twice, none missed
    assert results["cust-0001"].reference == processor.charges()[0]["id"]
    # the old holder, resumed, sends its request at last: the processor refuses its token
    intended = old.outgoing("cust-0001", billing_charges.charge_params(DAY, "cust-0001"))
    late = billing_charges.stripe_sender(billing_charges.stripe_client(processor.url))
    with pytest.raises(ProcessorRefusedToken):
        late(intended)
    assert processor.refused()[-1]["token"] == a.token
    with pytest.raises(StaleToken):  # and the sink refuses it: nothing recorded for it
        charge(old, "cust-0002", processor.url, kind)
    assert charged(processor) == Counter(CUSTOMERS)
    assert billing_rows(sink_db, key) == Counter((c, "accepted") for c in CUSTOMERS)


def test_a_declined_card_is_the_items_outcome_not_retried_not_charged(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor, kind: str, key: str
) -> None:
    processor.faults.add("declined", customers=["cust-0002"], times=None)
    ext = calls(sink_db, holder(store, key, "a"))
    sent = [charge(ext, c, processor.url, kind) for c in CUSTOMERS]
    assert [r.state for r in sent] == ["accepted", "declined", "accepted"]
    assert sent[1].detail["reason"] == "card_declined"
    again = charge(ext, "cust-0002", processor.url, kind)  # the body retried
    taken = charge(calls(sink_db, holder(store, key, "b")), "cust-0002", processor.url, kind)
    assert not again.sent
    assert not taken.sent  # a takeover does not send it again either
    assert again.state == taken.state == "declined"
    assert charged(processor) == Counter(["cust-0001", "cust-0003"])
    assert intents(processor)["cust-0002"] == 1  # asked once, never retried
    assert outcomes(sink_db, key)["cust-0002"] == "declined"
    assert billing_rows(sink_db, key)[("cust-0002", "declined")] == 1


def test_a_malformed_answer_is_a_clear_error_and_the_item_is_charged_once_later(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor, kind: str, key: str
) -> None:
    processor.faults.add("malformed", customers=["cust-0001"])  # charged, answer not JSON
    ext = calls(sink_db, holder(store, key, "b"))
    with pytest.raises(MalformedAnswer, match="not JSON"):
        charge(ext, "cust-0001", processor.url, kind)
    assert outcomes(sink_db, key) == {"cust-0001": "intended"}  # not skipped, not done
    later = charge(ext, "cust-0001", processor.url, kind)  # replayed, or found by lookup
    assert later.state == "accepted"
    assert later.reference == processor.charges()[0]["id"]
    assert charged(processor) == Counter(["cust-0001"])


def test_a_processor_that_is_down_defers_the_item_never_skips_it(
    store: LeaseStore, sink_db: str, processor: PaymentProcessor, kind: str, key: str
) -> None:
    ext = calls(sink_db, holder(store, key, "b"))
    processor.stop()
    with pytest.raises(ProcessorUnavailable):
        charge(ext, "cust-0001", processor.url, kind)
    assert outcomes(sink_db, key) == {"cust-0001": "intended"}
    assert billing_rows(sink_db, key) == Counter()
    processor.start()
    assert charge(ext, "cust-0001", processor.url, kind).state == "accepted"
    assert charged(processor) == Counter(["cust-0001"])


# -- the fence's one-statement steps ----------------------------------------------------------


def test_a_superseded_token_is_refused_before_anything_is_sent(
    store: LeaseStore, sink_db: str, key: str
) -> None:
    with PaymentProcessor() as p:  # it checks nothing: only the sink's fence refuses here
        a = holder(store, key, "a")
        old = calls(sink_db, a)
        b = holder(store, key, "b")
        charge(calls(sink_db, b), "cust-0001", p.url, "tokens")
        sent: list[OutgoingCall] = []

        def send(call: OutgoingCall) -> CallAnswer:
            sent.append(call)
            return CallAnswer.accepted("ch_never")

        with pytest.raises(StaleToken) as refused:
            old.call("cust-0002", billing_charges.charge_params(DAY, "cust-0002"), send)
        assert refused.value.current == b.token
        assert sent == []  # the token check and the claim are one step: nothing left
        assert outcomes(sink_db, key) == {"cust-0001": "accepted"}  # no intent row for it
        assert charged(p) == Counter(["cust-0001"])


def test_an_older_holder_frozen_in_its_fenced_transaction_is_ended_not_waited_for(
    store: LeaseStore, sink_db: str, key: str
) -> None:
    with PaymentProcessor() as p:
        a = holder(store, key, "a")
        frozen = sink(sink_db)
        inside, release = threading.Event(), threading.Event()
        ended: list[BaseException] = []

        def frozen_holder() -> None:
            # holds the key's fence row, as a holder frozen mid-statement does
            try:
                with fenced_transaction(frozen, key, a.token, idle_timeout=60):
                    inside.set()
                    release.wait(30)
                    frozen.execute("SELECT 1")  # its session was ended meanwhile
            except psycopg.OperationalError as exc:
                ended.append(exc)

        thread = threading.Thread(target=frozen_holder)
        thread.start()
        assert inside.wait(10)
        b = holder(store, key, "b")
        new = calls(sink_db, b, lock_timeout=0.3)
        done = charge(new, "cust-0001", p.url, "tokens")
        release.set()
        thread.join(30)
        assert done.state == "accepted"
        assert len(ended) == 1  # the frozen holder could not commit after the newer one
        assert charged(p) == Counter(["cust-0001"])
        assert outcomes(sink_db, key) == {"cust-0001": "accepted"}


def test_eight_calls_in_flight_under_one_key_charge_each_customer_once(
    store: LeaseStore, sink_db: str, key: str
) -> None:
    names = [f"cust-{i:04d}" for i in range(1, 41)]
    with PaymentProcessor(check_tokens=True) as p:
        lease = holder(store, key, "b")
        workers = [calls(sink_db, lease) for _ in range(8)]  # a connection each

        def run(n: int) -> list[CallResult]:
            return [charge(workers[n], c, p.url, "tokens") for c in names[n::8]]

        with ThreadPoolExecutor(8) as pool:
            results = [r for got in pool.map(run, range(8)) for r in got]
        again = [charge(workers[0], c, p.url, "tokens") for c in names]  # a retry of it all
        assert all(r.sent and r.state == "accepted" for r in results)
        assert not any(r.sent for r in again)
        assert charged(p) == Counter(names)
        assert billing_rows(sink_db, key) == Counter((c, "accepted") for c in names)


def test_external_calls_need_an_autocommit_connection(
    store: LeaseStore, sink_db: str, key: str
) -> None:
    # a claim inside the caller's open transaction would commit only with it, after the call
    conn = psycopg.connect(sink_db)
    OPEN.append(conn)
    lease = holder(store, key, "b")
    ext = ExternalCalls(lambda: conn, lease.key, lease.token)
    with pytest.raises(InvalidLeaseInput, match="autocommit"):
        ext.call("cust-0001", {"amount": 1}, lambda call: CallAnswer.accepted("ch_x"))
