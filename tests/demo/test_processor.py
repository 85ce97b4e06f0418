"""The payment processor stand-in behaves as Stripe documents idempotent requests.

Driven by the official ``stripe`` SDK pointed at the local server, as the DAG code drives it;
the assertions count the charges the processor made.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import stripe

from airflow_plugins.demo.processor import KEY_TTL_S, PaymentProcessor, ProcessorProcess

PARAMS: dict[str, Any] = {
    "amount": 1234,
    "currency": "usd",
    "confirm": True,
    "payment_method": "pm_card_visa",
    "metadata": {"customer": "cust-0001"},
}


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def processor(clock: Clock) -> Iterator[PaymentProcessor]:
    with PaymentProcessor(clock=clock) as p:
        yield p


def client(url: str, timeout: float = 10.0) -> stripe.StripeClient:
    return stripe.StripeClient(
        "sk_test_x",
        base_addresses={"api": url},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=timeout),
    )


def create(url: str, key: str | None, params: dict[str, Any] | None = None, **headers: str) -> Any:
    options: dict[str, Any] = {"headers": headers}
    if key is not None:
        options["idempotency_key"] = key
    return client(url).v1.payment_intents.create(params=params or PARAMS, options=options)  # type: ignore[arg-type]


def test_two_keys_with_the_same_parameters_make_two_charges(processor: PaymentProcessor) -> None:
    first = create(processor.url, "key-a")
    second = create(processor.url, "key-b")
    assert first.id != second.id
    assert len(processor.charges()) == 2  # it does not deduplicate on content


def test_one_key_makes_one_charge_and_replays_its_answer(processor: PaymentProcessor) -> None:
    first = create(processor.url, "key-a")
    again = create(processor.url, "key-a")
    assert again.id == first.id
    assert again.latest_charge == first.latest_charge
    assert [c["idempotency_key"] for c in processor.charges()] == ["key-a"]


def test_a_failed_first_answer_is_replayed_too(processor: PaymentProcessor) -> None:
    processor.faults.add("declined", customers=["cust-0001"])
    with pytest.raises(stripe.CardError) as first:
        create(processor.url, "key-a")
    # the fault is used up, but the key's first answer (declined) is what the key keeps giving
    with pytest.raises(stripe.CardError) as again:
        create(processor.url, "key-a")
    assert first.value.code == again.value.code == "card_declined"
    assert processor.charges() == []


def test_the_same_key_with_other_parameters_is_an_idempotency_error(
    processor: PaymentProcessor,
) -> None:
    create(processor.url, "key-a")
    with pytest.raises(stripe.IdempotencyError) as refused:
        create(processor.url, "key-a", {**PARAMS, "amount": 999})
    assert refused.value.http_status == 400
    assert len(processor.charges()) == 1


def test_a_request_while_the_first_with_its_key_is_in_flight_is_a_conflict(
    clock: Clock,
) -> None:
    with PaymentProcessor(clock=clock, latency=1.0) as slow:
        first: list[Any] = []
        thread = threading.Thread(target=lambda: first.append(create(slow.url, "key-a")))
        thread.start()
        try:
            deadline = 0
            while not slow._keys and deadline < 200:  # the first has started executing
                threading.Event().wait(0.01)
                deadline += 1
            with pytest.raises(stripe.APIError) as conflict:
                create(slow.url, "key-a")
        finally:
            thread.join()
        assert conflict.value.http_status == 409
        assert (conflict.value.json_body or {})["error"]["code"] == "idempotency_key_in_use"
        assert len(slow.charges()) == 1
        assert create(slow.url, "key-a").id == first[0].id  # afterwards: the replay


def test_a_key_expires_after_24_hours(processor: PaymentProcessor, clock: Clock) -> None:
    first = create(processor.url, "key-a")
    clock.now += KEY_TTL_S - 1
    assert create(processor.url, "key-a").id == first.id
    clock.now += 2
    assert create(processor.url, "key-a").id != first.id
    assert len(processor.charges()) == 2


def test_invalid_parameters_are_refused_before_anything_is_saved(
    processor: PaymentProcessor,
) -> None:
    with pytest.raises(stripe.InvalidRequestError):
        create(processor.url, "key-a", {"currency": "usd"})
    assert create(processor.url, "key-a").status == "succeeded"  # the key was not used up
    assert len(processor.charges()) == 1


def test_it_lists_the_charges_it_made(processor: PaymentProcessor) -> None:
    made = {create(processor.url, f"key-{i}").latest_charge for i in range(3)}
    listed = client(processor.url).v1.charges.list(params={"limit": 100})
    assert {c.id for c in listed.data} == made


def test_the_token_checking_processor_refuses_a_lower_token(clock: Clock) -> None:
    with PaymentProcessor(clock=clock, check_tokens=True, idempotency=False) as p:
        create(p.url, "k1", **{"X-Lease-Key": "billing/charge/d", "X-Fencing-Token": "7"})
        with pytest.raises(stripe.APIError) as refused:
            create(p.url, "k2", **{"X-Lease-Key": "billing/charge/d", "X-Fencing-Token": "6"})
        assert refused.value.http_status == 409
        assert (refused.value.json_body or {})["error"]["code"] == "stale_fencing_token"
        # another lease key has its own tokens; no lease key at all is refused
        create(p.url, "k3", **{"X-Lease-Key": "billing/charge/e", "X-Fencing-Token": "1"})
        with pytest.raises(stripe.InvalidRequestError):
            create(p.url, "k4")
        assert len(p.charges()) == 2


def test_a_read_with_a_newer_token_shuts_out_the_older_holder(clock: Clock) -> None:
    with PaymentProcessor(clock=clock, check_tokens=True, idempotency=False) as p:
        lease = {"X-Lease-Key": "billing/charge/d"}
        client(p.url).v1.payment_intents.search(
            params={"query": "metadata['customer']:'cust-0001'"},
            options={"headers": {**lease, "X-Fencing-Token": "9"}},
        )
        with pytest.raises(stripe.APIError):
            create(p.url, "k1", **lease, **{"X-Fencing-Token": "8"})
        assert p.charges() == []


@pytest.mark.parametrize(
    ("mode", "error", "charged"),
    [
        ("error_500", stripe.APIError, 0),
        ("malformed", stripe.APIError, 1),
        ("down", stripe.APIConnectionError, 0),
        ("timeout_after_commit", stripe.APIConnectionError, 1),
    ],
)
def test_fault_modes(
    processor: PaymentProcessor, mode: str, error: type[Exception], charged: int
) -> None:
    processor.faults.add(mode, delay=2.0)
    with pytest.raises(error):
        client(processor.url, timeout=0.5).v1.payment_intents.create(
            params=PARAMS,  # type: ignore[arg-type]
            options={"idempotency_key": "key-a"},
        )
    assert len(processor.charges()) == charged
    # the same key afterwards: one charge in all, whatever the fault did
    assert create(processor.url, "key-a").status == "succeeded"
    assert len(processor.charges()) == 1


def test_a_stopped_processor_refuses_connections_and_comes_back_with_its_state(
    processor: PaymentProcessor,
) -> None:
    first = create(processor.url, "key-a")
    processor.stop()
    with pytest.raises(stripe.APIConnectionError):
        create(processor.url, "key-a")
    processor.start()
    assert create(processor.url, "key-a").id == first.id


def test_the_processor_process_is_steered_over_http(tmp_path: Any) -> None:
    proc = ProcessorProcess(tmp_path / "processor.log")
    url = proc.start()
    try:
        spec = json.dumps({"mode": "declined", "customers": ["cust-0001"]}).encode()
        urllib.request.urlopen(
            urllib.request.Request(url + "/_processor/faults", data=spec, method="POST"),
            timeout=10,
        ).close()
        with pytest.raises(stripe.CardError):
            create(url, "key-a")
        create(url, "key-b", {**PARAMS, "metadata": {"customer": "cust-0002"}})
        assert [c["customer"] for c in proc.charges()] == ["cust-0002"]
    finally:
        proc.stop()


def test_a_token_superseded_while_its_request_runs_is_refused_not_charged(clock: Clock) -> None:
    # the check and the charge are one step: a newer token seen while an older holder's request
    # is in flight (here a newer holder's read) refuses the older one where it would charge
    with PaymentProcessor(clock=clock, check_tokens=True, idempotency=False, latency=1.0) as p:
        lease = {"X-Lease-Key": "billing/charge/d"}
        outcome: list[BaseException | None] = []

        def older() -> None:
            try:
                create(p.url, "k1", **lease, **{"X-Fencing-Token": "7"})
                outcome.append(None)
            except stripe.APIError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=older)
        thread.start()
        try:
            for _ in range(100):  # until the older request is in, past its token check
                if p._tokens.get("billing/charge/d") == 7:
                    break
                threading.Event().wait(0.02)
            client(p.url).v1.payment_intents.search(
                params={"query": "metadata['customer']:'cust-0001'"},
                options={"headers": {**lease, "X-Fencing-Token": "8"}},
            )
        finally:
            thread.join(timeout=20)
        assert isinstance(outcome[0], stripe.APIError)
        assert outcome[0].http_status == 409
        assert p.charges() == []
