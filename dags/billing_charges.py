"""The billing work of the example DAGs: charge every customer of a business date once.

Not a DAG file (listed in ``.airflowignore``); the billing DAGs import it. The same body runs
protected (a ``Fence`` from the plugin: fenced sink transactions, a ledger of charged customers)
and plain (``Fence.unprotected``: what Airflow does without the plugin), so a comparison between
the two differs only in the protection.

``charge_at_processor`` charges through the payment processor with the official ``stripe`` SDK
(a PaymentIntent per customer, the item's idempotency key and the fence's token headers on each
call), through ``fence.external_call``: the call is made outside any transaction and its answer
(the processor's charge id, or a decline) is recorded in the billing table in a fenced one.
The processor's address is the ``payment_processor`` connection
(``AIRFLOW_CONN_PAYMENT_PROCESSOR``, e.g. ``http://127.0.0.1:8765``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from airflow_plugins.lease.external_call import (
    CallAnswer,
    CallResult,
    MalformedAnswer,
    OutgoingCall,
    ProcessorRefusedToken,
    ProcessorUnavailable,
)
from airflow_plugins.lease.fence import Fence

if TYPE_CHECKING:
    import stripe

SQL = Path(__file__).resolve().parent / "sql"
CUSTOMER_COUNT = 340
SINK_CONN_ID = "billing_db"
PROCESSOR_CONN_ID = "payment_processor"
# a test-mode key: the stand-in processor takes any; a real deployment reads it from a secret
STRIPE_API_KEY = "sk_test_exactly_once_demo"


def sql(name: str) -> str:
    """The text of ``dags/sql/<name>.sql``."""
    return (SQL / f"{name}.sql").read_text()


def customers(count: int = CUSTOMER_COUNT) -> list[str]:
    """The customers billed every night: ``cust-0001`` .. ``cust-0340``."""
    return [f"cust-{i:04d}" for i in range(1, count + 1)]


def amount_cents(customer: str) -> int:
    """The (deterministic) nightly amount of one customer."""
    return 1000 + int(customer.rsplit("-", 1)[1]) * 37 % 50000


def prepare_sink(dsn: str) -> None:
    """Creates the charges table and the sink fence (idempotent)."""
    from airflow_plugins.lease import SINK_FENCE, migrate

    migrate(dsn, SINK_FENCE)
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute(sql("schema_lock"))  # runs starting together create it once
        conn.execute(sql("billing_schema"))


def _payment_call(delay: float) -> None:
    """Stands for the payment processor's charge call (the real one takes ~40 s a customer)."""
    if delay > 0:
        time.sleep(delay)


def charge_customers(
    fence: Fence, names: list[str], *, delay: float, writer: str
) -> dict[str, Any]:
    """Charges each customer in its own fenced transaction, ``delay`` seconds apart.

    One transaction per customer: claim the customer in the ledger, make the payment call,
    record the charge, commit. A superseded holder is refused at its next transaction (or its
    commit), and a taken-over run skips customers already charged.

    Returns ``charged``: the date's customers charged by any holder of the key (the whole
    night, also after a takeover: what the invoice mail downstream needs), ``charged_now``: by
    this try, ``skipped``: found charged already, ``customers``: how many were to be charged.
    """
    charged = skipped = 0
    for customer in names:
        fence.check()
        with fence.transaction() as tx:
            if tx.claim(customer):
                _payment_call(delay)
                tx.conn.execute(
                    sql("billing_charge"),
                    {
                        "business_date": fence.business_date,
                        "customer": customer,
                        "amount_cents": amount_cents(customer),
                        "token": fence.token,
                        "writer": writer,
                    },
                )
                charged += 1
            else:
                skipped += 1
    # after a takeover this holder did only part of the night: the result that every later
    # run and the downstream tasks are handed counts every holder's charges
    done = set(fence.done_items()) & set(names) if fence.protected else None
    return {
        "charged": charged if done is None else len(done),
        "charged_now": charged,
        "skipped": skipped,
        "customers": len(names),
    }


def charge_unless_charged(
    conn: psycopg.Connection[Any],
    business_date: str,
    names: list[str],
    *,
    delay: float,
    writer: str,
) -> dict[str, Any]:
    """A plain task's resumable billing: charge each customer not yet charged for the date.

    Check, make the payment call, record (autocommit ``conn``): safe to re-run after a crash only
    if no other execution runs at the same time, which is what the cluster policy's one holder
    per key gives a tagged DAG. Two executions at once both see "not charged" and both charge.
    """
    charged = skipped = 0
    for customer in names:
        params = {"business_date": business_date, "customer": customer}
        row = conn.execute(sql("billing_already_charged"), params).fetchone()
        if row and row[0]:
            skipped += 1
            continue
        _payment_call(delay)
        conn.execute(
            sql("billing_charge"),
            {**params, "amount_cents": amount_cents(customer), "token": 0, "writer": writer},
        )
        charged += 1
    return {"charged": charged, "skipped": skipped, "customers": len(names)}


# -- the payment processor (Stripe's API, through the official SDK) -------------------------------


def payment_api_base() -> str:
    """The processor's base address, from the ``payment_processor`` connection.

    Raises:
        RuntimeError: the connection is not configured.
    """
    name = "AIRFLOW_CONN_" + PROCESSOR_CONN_ID.upper()
    raw = os.environ.get(name, "").strip()
    if not raw:
        raise RuntimeError(f"no payment processor configured: set {name} (its base URL)")
    return raw.rstrip("/")


def stripe_client(api_base: str, *, timeout: float = 10.0) -> stripe.StripeClient:
    """A Stripe client on ``api_base``; the SDK does not retry (the fence decides that)."""
    import stripe

    return stripe.StripeClient(
        STRIPE_API_KEY,
        base_addresses={"api": api_base},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=timeout),
    )


def charge_params(business_date: str, customer: str) -> dict[str, Any]:
    """The PaymentIntent one customer's nightly charge creates (the same for every holder)."""
    return {
        "amount": amount_cents(customer),
        "currency": "usd",
        "confirm": True,
        "payment_method": "pm_card_visa",
        "description": f"nightly billing {business_date}",
        "metadata": {"customer": customer, "business_date": business_date},
    }


def _options(call: OutgoingCall) -> dict[str, Any]:
    if call.idempotency_key is None:
        return {}
    headers = {k: v for k, v in call.headers.items() if k != "Idempotency-Key"}
    return {"idempotency_key": call.idempotency_key, "headers": headers}


def stripe_sender(client: stripe.StripeClient) -> Any:
    """``send`` for ``fence.external_call``: creates and confirms the PaymentIntent.

    Maps Stripe's answers to the fence's: succeeded -> accepted (its charge id); a card error ->
    declined (recorded, not retried); no answer, 5xx or the key in flight -> unavailable (sent
    again with the same key); a stale token -> refused; an answer that is not one -> malformed.
    """
    import stripe

    def send(call: OutgoingCall) -> CallAnswer:
        params = dict(call.params)
        if call.idempotency_key is not None:
            params["metadata"] = {**params["metadata"], "idempotency_key": call.idempotency_key}
        try:
            intent = client.v1.payment_intents.create(
                params=params,  # type: ignore[arg-type]
                options=_options(call),  # type: ignore[arg-type]
            )
        except stripe.CardError as exc:
            raw: Any = exc.json_body or {}
            body: dict[str, Any] = raw.get("error") or {}
            return CallAnswer.declined(
                str(exc.code or "card_declined"),
                reference=(body.get("payment_intent") or {}).get("id"),
                decline_code=body.get("decline_code"),
            )
        except stripe.APIConnectionError as exc:
            raise ProcessorUnavailable(
                f"payment processor: no answer ({exc.user_message})"
            ) from exc
        except stripe.APIError as exc:
            raise _api_error(call, exc) from exc
        charge_id = getattr(intent, "latest_charge", None)
        if getattr(intent, "status", None) != "succeeded" or not isinstance(charge_id, str):
            raise MalformedAnswer(f"payment processor: not a succeeded PaymentIntent: {intent!r}")
        return CallAnswer.accepted(charge_id, payment_intent=intent.id, amount=intent.amount)

    return send


def stripe_lookup(client: stripe.StripeClient) -> Any:
    """``lookup`` for ``fence.external_call``: did an earlier send of this item reach Stripe?

    Searches PaymentIntents by the item's idempotency key (kept in the metadata), with this
    holder's token headers: a token-checking processor refuses every older holder from then on,
    so what the search finds is all there will be. Needed for a processor that does not honour
    idempotency keys; with one that does, re-sending is the lookup.
    """
    import stripe

    def lookup(call: OutgoingCall) -> CallAnswer | None:
        query = f"metadata['idempotency_key']:'{call.idempotency_key}'"
        try:
            found = client.v1.payment_intents.search(
                params={"query": query},
                options={"headers": _options(call).get("headers", {})},
            )
        except stripe.APIConnectionError as exc:
            raise ProcessorUnavailable(
                f"payment processor: no answer ({exc.user_message})"
            ) from exc
        except stripe.APIError as exc:
            raise _api_error(call, exc) from exc
        for intent in found.data:
            if intent.status == "succeeded" and isinstance(intent.latest_charge, str):
                return CallAnswer.accepted(
                    intent.latest_charge, payment_intent=intent.id, amount=intent.amount
                )
        return None

    return lookup


def _api_error(call: OutgoingCall, exc: Any) -> Exception:
    status = exc.http_status or 0
    code = ((exc.json_body or {}).get("error") or {}).get("code")
    if status == 409 and code == "stale_fencing_token":
        return ProcessorRefusedToken(call.key, call.token, None)
    if status == 409 or status >= 500 or status == 429:
        return ProcessorUnavailable(f"payment processor answered {status} ({code or 'error'})")
    if 200 <= status < 300:
        return MalformedAnswer(f"payment processor: an answer that is not JSON (HTTP {status})")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


def charge_at_processor(
    fence: Fence,
    names: list[str],
    *,
    delay: float,
    writer: str,
    api_base: str | None = None,
) -> dict[str, Any]:
    """Charges each customer at the payment processor once, recording its answer.

    Per customer: ``delay`` seconds of other work, then ``fence.external_call``: the customer is
    claimed as intended, the PaymentIntent is created with the customer's stable idempotency key
    and this holder's token, and the processor's answer (charge id, or a decline) is written to
    ``billing.charges`` in a fenced transaction. Customers answered before are skipped; one an
    earlier holder sent is sent again with the same key (the processor replays its answer).
    """
    send = stripe_sender(stripe_client(api_base or payment_api_base()))
    charged = declined = skipped = 0

    def record(tx: Any, result: CallResult) -> None:
        tx.conn.execute(
            sql("billing_charge_answered"),
            {
                "business_date": fence.business_date,
                "customer": result.item,
                "amount_cents": amount_cents(result.item),
                "token": fence.token,
                "writer": writer,
                "outcome": "charged" if result.state == "accepted" else "declined",
                "processor_ref": result.reference,
            },
        )

    for customer in names:
        fence.check()
        _payment_call(delay)
        result = fence.external_call(
            customer, charge_params(fence.business_date, customer), send, record=record
        )
        if result.state == "shadow":
            charged += 1  # what it would charge, counted as the primary counts it: comparable
        elif not result.sent:
            skipped += 1
        elif result.state == "accepted":
            charged += 1
        else:
            declined += 1
    return {"charged": charged, "declined": declined, "skipped": skipped, "customers": len(names)}
