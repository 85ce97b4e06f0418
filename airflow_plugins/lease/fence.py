"""The ``Fence`` a protected body receives: its lease, its sink transaction, its stop signal.

Imports nothing from Airflow, so a Temporal activity (the bridge) can hand its work the same
object. A superseded holder's ``transaction()`` raises ``StaleToken`` (at the fence, before any
write), or its commit fails; ``check()`` raises ``FenceStopped`` once the task is told to stop
or the lease is lost. ``Fence`` shows a body.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Protocol

import psycopg

from airflow_plugins.lease import (
    FencedWrite,
    InvalidLeaseInput,
    Lease,
    LeaseLost,
    advance_fence,
    done_items,
    fenced_transaction,
    http_headers,
    idempotency_key,
)
from airflow_plugins.lease.external_call import (
    DEFAULT_IN_FLIGHT,
    CallResult,
    ExternalCalls,
    Lookup,
    OutgoingCall,
    Record,
    Send,
    checked_answer,
)
from airflow_plugins.lease.sink_fence import DEFAULT_IDLE_TIMEOUT
from airflow_plugins.lease.task_state import TaskState

SinkConnect = Callable[[], "psycopg.Connection[Any]"]


class FenceStopped(LeaseLost):
    """The work was told to stop (``on_kill``) or its lease was lost: stop writing now."""


class SinkWrite(Protocol):
    """What ``Fence.transaction`` yields: a fenced (or, protection off, a plain) transaction."""

    conn: psycopg.Connection[Any]
    key: str
    token: int

    def claim(self, item: str) -> bool:
        """Records ``item`` as done; False means it was done already: skip it."""

    def claim_many(self, items: Iterable[str]) -> list[str]:
        """Claims many items; returns those not done yet."""

    def done(self, items: Iterable[str]) -> set[str]:
        """The items already done under this key."""

    def headers(self, item: str) -> dict[str, str]:
        """Fence headers for an HTTP call that writes ``item``."""


class UnfencedWrite:
    """A plain transaction with the ``FencedWrite`` interface: protection is switched off.

    Every item is "new", nothing is recorded: this is what plain Airflow does.
    """

    def __init__(self, conn: psycopg.Connection[Any], key: str) -> None:
        self.conn = conn
        self.key = key
        self.token = 0

    def claim(self, item: str) -> bool:
        """Always True: nothing is fenced."""
        return True

    def claim_many(self, items: Iterable[str]) -> list[str]:
        """Every item: nothing is fenced."""
        return list(items)

    def done(self, items: Iterable[str]) -> set[str]:
        """Nothing: no ledger is kept."""
        return set()

    def headers(self, item: str) -> dict[str, str]:
        """Only the idempotency key (no token exists)."""
        return {"Idempotency-Key": idempotency_key(self.key, item)}


class Fence:
    """The protected body's handle on its lease and its sink.

    A body looks like::

        def charge_all(fence: Fence, customers: list[str]) -> dict[str, int]:
            charged = 0
            with fence.transaction() as tx:
                for customer in tx.claim_many(customers):   # skips items already done
                    fence.check()                            # stop promptly when told to
                    tx.conn.execute("INSERT INTO charges ...", (customer, fence.token))
                    charged += 1
            return {"charged": charged}

    Attributes:
        key: the lease key (business identity), e.g. ``billing_nightly/charge/2024-02-15``.
        token: the fencing token of this holder (0 when protection is off).
        attempt: how many times the key has been granted (1 for the first run).
        business_date: the business date the key stands for.
        lease: the held lease (None when protection is off).
        protected: False when the plugin is disabled and the body runs plainly.
    """

    def __init__(
        self,
        *,
        key: str,
        token: int,
        attempt: int,
        business_date: str,
        lease: Lease | None,
        sink_connect: SinkConnect | None = None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        self.key = key
        self.token = token
        self.attempt = attempt
        self.business_date = business_date
        self.lease = lease
        self.idle_timeout = idle_timeout
        self._sink_connect = sink_connect
        self._conn: psycopg.Connection[Any] | None = None
        self.stop_event = threading.Event()
        self.stop_reason: str | None = None
        # set when check() raised FenceStopped: the body was stopped inside its work, so
        # whatever it returns afterwards (a swallowed stop) is not the key's whole work
        self.stop_raised = False
        self._calls: ExternalCalls | None = None
        self._state: TaskState | None = None

    @classmethod
    def unprotected(
        cls, key: str, business_date: str, sink_connect: SinkConnect | None = None
    ) -> Fence:
        """The fence of a body running with protection switched off."""
        return cls(
            key=key,
            token=0,
            attempt=0,
            business_date=business_date,
            lease=None,
            sink_connect=sink_connect,
        )

    @property
    def generation(self) -> int:
        """The lease's re-run generation: an approved re-run claims its items afresh."""
        return 0 if self.lease is None else self.lease.generation

    @property
    def protected(self) -> bool:
        """Whether a lease protects this body."""
        return self.lease is not None

    # -- stopping ---------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """Tells the body to stop (``on_kill``, or the lease keeper lost the lease)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop_event.set()

    @property
    def stopped(self) -> bool:
        """True once the body was told to stop."""
        return self.stop_event.is_set()

    def check(self) -> None:
        """Raises ``FenceStopped`` once the body must stop; call it between items of work.

        The raise is recorded (``stop_raised``): a body that catches it and returns anyway is
        not completed (its lease is released or failed, and the next holder finishes the work
        from the ledger).
        """
        if self.stop_event.is_set():
            self.stop_raised = True
            raise FenceStopped(self.key, self.token, self.stop_reason or "told to stop")

    # -- durable task state ------------------------------------------------------------------

    def attach_state(self, state: TaskState) -> None:
        """Gives the body its key's task state (``run_under_lease`` does, before the body)."""
        self._state = state

    @property
    def state(self) -> TaskState:
        """The key's durable task state: values and submitted jobs, kept in the lease store
        under the lease key, written only while this holder holds the lease
        (``airflow_plugins.lease.task_state``).

        Raises:
            RuntimeError: no lease protects this body (protection is off).
        """
        if self._state is None:
            raise RuntimeError(f"{self.key}: no durable task state: no lease protects this body")
        return self._state

    # -- the sink ---------------------------------------------------------------------------

    def connection(self) -> psycopg.Connection[Any]:
        """The sink connection (opened once, on first use, from the task's ``sink_conn_id``).

        Raises:
            RuntimeError: the task names no sink.
        """
        if self._conn is None or self._conn.closed:
            if self._sink_connect is None:
                raise RuntimeError(
                    f"{self.key}: no sink configured; pass sink_conn_id to the operator"
                )
            self._conn = self._sink_connect()
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SinkWrite]:
        """A sink transaction only this key's newest holder can commit.

        Raises:
            StaleToken: a newer holder has written under the key; nothing was written.
            FenceStopped: the body was told to stop before the transaction began.
        """
        self.check()
        conn = self.connection()
        if self.lease is None:
            with conn.transaction():
                yield UnfencedWrite(conn, self.key)
            return
        write: FencedWrite
        with fenced_transaction(
            conn, self.key, self.token, idle_timeout=self.idle_timeout, generation=self.generation
        ) as write:
            yield write

    def advance_sink_fence(self) -> None:
        """Raises the sink's fence to this token before any work (older holders are refused).

        Raises:
            StaleToken: a newer holder has already written (this one was superseded).
        """
        if self.lease is not None and self._sink_connect is not None:
            advance_fence(self.connection(), self.key, self.token)

    def done_items(self) -> list[str]:
        """Every item done under this key at the sink, by any holder of the key, in item order.

        After a takeover the body skips what earlier holders did; its result should describe
        the key's whole work (``{"charged": len(fence.done_items())}``), since that result is
        what every later run of the business date is handed. Empty when protection is off.
        """
        if self.lease is None:
            return []
        return done_items(self.connection(), self.key, self.generation)

    # a shadow's fence (the bridge's) records its external calls instead of sending them
    shadow = False

    @property
    def primary_key(self) -> str:
        """The key idempotency keys are built from: the lease key (a shadow's is the
        primary's, so both engines would send the same request)."""
        return self.key

    def idempotency_key(self, item: str) -> str:
        """A stable per-item idempotency key (the same for every holder of the key)."""
        return idempotency_key(self.primary_key, item, self.generation)

    def headers(self, item: str) -> dict[str, str]:
        """Headers that carry the fence to an HTTP sink: idempotency key, token, lease key."""
        if self.lease is None:
            return {"Idempotency-Key": self.idempotency_key(item)}
        return http_headers(self.key, self.token, item, self.generation)

    # -- external calls (a payment processor) -----------------------------------------------

    def external_calls(self) -> ExternalCalls:
        """This holder's external calls on the sink's ledger (``lease.external_call``); in
        shadow they are recorded (``would_send``), never sent."""
        if self._calls is None:
            self._calls = ExternalCalls(
                self.connection,
                self.key,
                self.token,
                idempotency_scope=self.primary_key,
                shadow=self.shadow,
                idle_timeout=self.idle_timeout,
                check=self.check,
                generation=self.generation,
            )
        return self._calls

    def external_call(
        self,
        item: str,
        params: dict[str, Any],
        send: Send,
        *,
        lookup: Lookup | None = None,
        record: Record | None = None,
    ) -> CallResult:
        """Makes ``item``'s call (a charge) once for the key, outside any transaction.

        Claims the item as intended, calls ``send`` with the item's stable idempotency key and
        this holder's token headers, records the answer (and runs ``record`` for the caller's
        writes) in a fenced transaction. An item answered before is not sent again; one an
        earlier holder sent is re-sent with the same key (the processor replays its answer).
        Protection off: the call plain code makes (no idempotency key, no ledger).

        Raises:
            StaleToken: a newer holder has the key.
            ProcessorUnavailable: the processor stayed unavailable; the item is not skipped.
            MalformedAnswer: the processor's answer was not one.
        """
        calls = [(item, params)]
        return self.external_call_many(calls, send, lookup=lookup, record=record, in_flight=1)[0]

    def external_call_many(
        self,
        calls: Iterable[tuple[str, dict[str, Any]]],
        send: Send,
        *,
        lookup: Lookup | None = None,
        record: Record | None = None,
        in_flight: int = DEFAULT_IN_FLIGHT,
    ) -> list[CallResult]:
        """Makes each ``(item, params)`` call once for the key, ``in_flight`` at a time.

        What ``external_call`` does per item, with up to ``in_flight`` requests at the
        processor at once (``send`` must be thread-safe) and the claims and records of items
        that wait or answer together sharing one fenced commit. Results in the order given.
        On a failure no further item is claimed, those in flight are finished and recorded,
        and the first error is raised (see ``ExternalCalls.call_many``).
        Protection off: the plain calls, ``in_flight`` at a time, no key, no ledger.
        """
        if self.lease is not None:
            return self.external_calls().call_many(
                calls, send, lookup=lookup, record=record, in_flight=in_flight
            )
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
            raise InvalidLeaseInput(f"in_flight is an integer >= 1, not {in_flight!r}")
        return self._plain_calls(list(calls), send, record, in_flight)

    def _plain_calls(
        self,
        pairs: list[tuple[str, dict[str, Any]]],
        send: Send,
        record: Record | None,
        in_flight: int,
    ) -> list[CallResult]:
        """Protection off: the plain calls (no key, no ledger), each answer recorded on this
        thread as it comes back; on a failure the rest are not sent and the first is raised."""

        def plain(pair: tuple[str, dict[str, Any]]) -> CallResult:
            self.check()
            got = send(OutgoingCall(self.key, pair[0], 0, None, dict(pair[1])))
            answer = checked_answer(got)
            return CallResult(pair[0], answer.state, answer.reference, dict(answer.detail), True)

        def kept(result: CallResult) -> CallResult:
            if record is not None:  # on this thread, as each answer comes back
                with self.transaction() as tx:
                    record(tx, result)  # type: ignore[arg-type]
            return result

        if in_flight == 1:
            return [kept(plain(pair)) for pair in pairs]
        done: dict[int, CallResult] = {}
        failure: BaseException | None = None
        with ThreadPoolExecutor(in_flight) as pool:
            jobs = {pool.submit(plain, pair): n for n, pair in enumerate(pairs)}
            for job in as_completed(jobs):  # each answer recorded as it comes back
                if job.cancelled():
                    continue
                try:
                    done[jobs[job]] = kept(job.result())
                except BaseException as exc:  # the first is raised once the others are in
                    if failure is None:
                        failure = exc
                        for later in jobs:
                            later.cancel()
        if failure is not None:
            raise failure
        return [done[n] for n in range(len(pairs))]

    def close(self) -> None:
        """Closes the sink connection, if one was opened."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
