"""The HTTP side of the fence: one external call per item (a charge), made once per key and item.

The fence cannot refuse an HTTP call after it left, and a call made inside a fenced transaction
would hold the key's fence row for the whole round trip (every item of the key waits) and be
forgotten on rollback. So a call is three steps, the call outside any transaction:

1. **claim** the item as *intended*: one fenced statement (the fence advanced to the holder's
   token and the row claimed in the same statement, one commit: a superseded holder claims
   nothing), a row in ``runfence.external_call`` with the request and the item's idempotency
   key (the same for every holder of the key; a holder taking over an intended item takes the
   row, counting one more send);
2. **send** the request with that idempotency key and the holder's ``X-Fencing-Token`` /
   ``X-Lease-Key`` (retried with the same key while the processor is unavailable);
3. **record** the processor's answer (its reference, or a decline): one fenced statement (the
   fence, the answer, the ledger row), alone its own commit, or the first statement of a
   transaction with the caller's own business writes; the item is then done and never sent
   again.

Both commits are durable: the intent must survive a sink crash before the request leaves (a
newer holder's lookup depends on it), the answer before the item is skipped. An advance that
waits past ``lock_timeout`` for the fence row ends the key's older holders frozen in their
fenced transactions and tries once more, as ``fenced_transaction`` does.

The window between 1 and 3 (a holder frozen after the processor accepted, before its record) is
closed by the processor: one that honours idempotency keys replays the first answer to the next
holder's re-send; one that checks fencing tokens refuses the frozen holder's late call (and a
``lookup`` made with the newer token finds what the older one did). See the README for what a
processor with neither can be promised.

In shadow mode nothing is sent and nothing is written: the request the call would have made is
kept in ``would_send`` for the comparison with the primary's.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from typing import Any, Literal, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from airflow_plugins.lease.call_watchdog import WATCHDOG
from airflow_plugins.lease.errors import FenceBusy, InvalidLeaseInput, LeaseError, StaleToken
from airflow_plugins.lease.keys import check_key
from airflow_plugins.lease.queries import query
from airflow_plugins.lease.sink_fence import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_LOCK_TIMEOUT,
    FencedWrite,
    _check_item,
    _end_older_holders,
    fence_token,
    holder_mark,
    idempotency_key,
)

# Stripe prunes idempotency keys once they are 24 h old; an item intended longer ago than this
# is not re-sent blindly (the processor may have forgotten the key): it needs a lookup.
DEFAULT_REPLAY_WINDOW_S = 23 * 3600.0
# how many of call_many's calls are at the processor at once, by default
DEFAULT_IN_FLIGHT = 8

_T = TypeVar("_T")


class ProcessorUnavailable(LeaseError):
    """The processor did not answer (down, timed out, 5xx, the key's first request in flight).

    The call's fate may be unknown: the item stays intended and is re-sent with the same
    idempotency key later (a retry, or the next try). It is never skipped.
    """


class MalformedAnswer(LeaseError):
    """The processor answered something that is not an answer; the item stays intended."""


class ProcessorRefusedToken(StaleToken):
    """A token-checking processor refused the call: a newer holder has called under the key."""


class NeedsReconciliation(LeaseError):
    """An item was intended longer ago than the processor keeps idempotency keys and there is
    no ``lookup``: re-sending could act twice, so a person must check the processor first."""


@dataclasses.dataclass(frozen=True)
class OutgoingCall:
    """The request one item's call makes: what ``send`` (and ``lookup``) receive.

    ``idempotency_key`` is None only when protection is switched off (plain code's call).
    """

    key: str
    item: str
    token: int
    idempotency_key: str | None
    params: dict[str, Any]

    @property
    def headers(self) -> dict[str, str]:
        """The fence's headers for this call (none when protection is off)."""
        if self.idempotency_key is None:
            return {}
        return {
            "Idempotency-Key": self.idempotency_key,
            "X-Fencing-Token": str(self.token),
            "X-Lease-Key": self.key,
        }


@dataclasses.dataclass(frozen=True)
class CallAnswer:
    """What the processor answered, as ``send`` reports it.

    Build it with ``CallAnswer.accepted(reference)`` or ``CallAnswer.declined(reason)``.
    """

    state: Literal["accepted", "declined"]
    reference: str | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def accepted(cls, reference: str, **detail: Any) -> CallAnswer:
        """The processor did it; ``reference`` is its id (a charge id)."""
        return cls("accepted", reference, detail)

    @classmethod
    def declined(cls, reason: str, reference: str | None = None, **detail: Any) -> CallAnswer:
        """The processor refused the item for good (a declined card): its recorded outcome."""
        return cls("declined", reference, {"reason": reason, **detail})


@dataclasses.dataclass(frozen=True)
class CallResult:
    """One item's outcome.

    Attributes:
        state: ``accepted``, ``declined``, or ``shadow`` (not sent: a shadow run).
        reference: the processor's id for it.
        sent: this call sent the request now (False: recorded before, or shadow).
    """

    item: str
    state: Literal["accepted", "declined", "shadow"]
    reference: str | None
    detail: dict[str, Any]
    sent: bool


Send = Callable[[OutgoingCall], CallAnswer]
Lookup = Callable[[OutgoingCall], CallAnswer | None]
Record = Callable[[FencedWrite, CallResult], None]


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often an unavailable processor is asked again within one holder (same key)."""

    attempts: int = 5
    first_delay: float = 0.2
    max_delay: float = 5.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        return float(min(self.max_delay, self.first_delay * 2**attempt))


def checked_answer(answer: object) -> CallAnswer:
    """``answer`` if it is a usable answer.

    Raises:
        MalformedAnswer: not a ``CallAnswer``, or accepted without a reference.
    """
    if not isinstance(answer, CallAnswer) or answer.state not in ("accepted", "declined"):
        raise MalformedAnswer(f"send returned {type(answer).__name__}, not a CallAnswer")
    if answer.state == "accepted" and not (isinstance(answer.reference, str) and answer.reference):
        raise MalformedAnswer("the processor accepted the call but gave no reference")
    return answer


class ExternalCalls:
    """One holder's external calls under one lease key.

    Args:
        connect: the sink connection (autocommit; the ledger lives in the sink's database).
        key: the lease key.
        token: the holder's fencing token.
        idempotency_scope: the key idempotency keys are built from (a shadow's primary key).
        shadow: record what would be sent instead of sending.
        idle_timeout: a session idle inside the answer's transaction is ended after it.
        lock_timeout: how long a fenced step waits for the key's fence row before ending the
            key's older holders frozen in their fenced transactions (as fenced_transaction).
        check: called before each step; raises when the holder must stop.
        generation: the lease's re-run generation (``Lease.generation``): an approved re-run
            calls each item once more, with idempotency keys of its own.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        key: str,
        token: int,
        *,
        idempotency_scope: str | None = None,
        shadow: bool = False,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        retry: RetryPolicy | None = None,
        replay_window_s: float = DEFAULT_REPLAY_WINDOW_S,
        check: Callable[[], None] = lambda: None,
        sleep: Callable[[float], None] = time.sleep,
        generation: int = 0,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self._connect = connect
        self.key = key
        self.token = token
        self.scope = idempotency_scope or key
        self.shadow = shadow
        self.idle_timeout = idle_timeout
        self.lock_timeout = lock_timeout
        # each fenced statement and the record's commit wait at most this (plus lock_timeout)
        # for their answer, as fenced_transaction's do: a route that never answers cannot hold
        # this holder past its lease
        self.call_timeout = call_timeout
        self.retry = retry or RetryPolicy()
        self.replay_window_s = replay_window_s
        self._check = check
        self._sleep = sleep
        self.would_send: list[dict[str, Any]] = []
        self.generation = generation
        # what fence_begin sets, for the fenced statements (a session idle inside the answer's
        # transaction is ended; the advance waits at most lock_timeout; the holder's mark)
        self._bounds: dict[str, str] | None = None

    def outgoing(self, item: str, params: dict[str, Any]) -> OutgoingCall:
        """The request ``call`` would make for ``item``."""
        return OutgoingCall(
            key=self.key,
            item=_check_item(item),
            token=self.token,
            idempotency_key=idempotency_key(self.scope, item, self.generation),
            params=_json_params(params),
        )

    def call(
        self,
        item: str,
        params: dict[str, Any],
        send: Send,
        *,
        lookup: Lookup | None = None,
        record: Record | None = None,
    ) -> CallResult:
        """Makes ``item``'s call once for the key: claim, send, record.

        ``send`` makes the request with ``call.idempotency_key`` and ``call.headers`` and maps
        the processor's reply: a ``CallAnswer``, or ``ProcessorUnavailable`` (retried),
        ``ProcessorRefusedToken`` (superseded), any other error (the item stays intended).
        ``lookup`` (optional) asks the processor whether an earlier send of the item was made;
        it is used when an earlier holder may have sent it. ``record`` runs in the answer's
        fenced transaction, for the caller's own writes.

        Raises:
            StaleToken: a newer holder has the key (at the sink, or at the processor).
            ProcessorUnavailable: still unavailable after the retries; the item is not skipped.
            MalformedAnswer: the processor's answer was not one; the item stays intended.
            NeedsReconciliation: see the class.
        """
        return self.call_many([(item, params)], send, lookup=lookup, record=record, in_flight=1)[0]

    def call_many(
        self,
        calls: Iterable[tuple[str, dict[str, Any]]],
        send: Send,
        *,
        lookup: Lookup | None = None,
        record: Record | None = None,
        in_flight: int = DEFAULT_IN_FLIGHT,
    ) -> list[CallResult]:
        """Makes each ``(item, params)`` call once for the key, up to ``in_flight`` at a time.

        Each item is claimed, sent and recorded as ``call`` does it, but the items waiting for
        a free slot are claimed together (one fenced statement) and the answers that arrived
        together are recorded together (one fenced statement, and ``record`` for each in the
        same transaction): a fenced step's commit is shared by the items of its batch, so the
        fence adds a fraction of two commits per item. ``send`` (and ``lookup``) run on up to
        ``in_flight`` threads at once and must be thread-safe (the stripe SDK's client is);
        the sink connection is used by the calling thread only. The next ``in_flight`` items
        are claimed while the claimed ones are at the processor (not with ``lookup``: see
        ``_in_flight``). Results are in the order of ``calls``. When an item's send fails, no
        further item is sent; the calls in flight are finished and their answers recorded;
        then the first error is raised. When the sink or the fence refuses (``StaleToken``, a
        lost connection) or the holder is told to stop, the answers in flight are not recorded.
        Either way the items not recorded stay intended and are sent again with their keys
        later (the processor replays, or ``lookup`` finds them).

        Raises:
            InvalidLeaseInput: an item listed twice, or ``in_flight`` < 1.
            StaleToken, ProcessorUnavailable, MalformedAnswer, NeedsReconciliation: as ``call``.
        """
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
            raise InvalidLeaseInput(f"in_flight is an integer >= 1, not {in_flight!r}")
        outs = [self.outgoing(item, params) for item, params in calls]
        if len({out.item for out in outs}) != len(outs):
            raise InvalidLeaseInput(f"{self.key}: an item is listed twice in one call_many")
        if self.shadow:
            for out in outs:
                self.would_send.append(
                    {"item": out.item, "idempotency_key": out.idempotency_key, "params": out.params}
                )
            return [CallResult(out.item, "shadow", None, {}, sent=False) for out in outs]
        results: dict[str, CallResult] = {}
        if in_flight == 1:  # today's thread only: claim, send, record, item by item
            for out in outs:
                self._check()
                row = self._claim([out])[0]
                if row["state"] != "intended":
                    results[out.item] = _recorded(out.item, row)
                    continue
                answer, sent = self._resolve(out, row, send, lookup, threading.Event())
                results.update(self._record([(out, answer, sent)], record))
        else:
            self._in_flight(outs, send, lookup, record, in_flight, results)
        return [results[out.item] for out in outs]

    def _in_flight(
        self,
        outs: list[OutgoingCall],
        send: Send,
        lookup: Lookup | None,
        record: Record | None,
        in_flight: int,
        results: dict[str, CallResult],
    ) -> None:
        """``call_many``'s window: ``in_flight`` threads send; the next ``in_flight`` items
        are claimed and queued for them while they do (a thread that finishes takes the next
        at once); the answers are recorded as they come back (those that came together, in
        one statement). With ``lookup`` (a processor that may not replay by key) nothing is
        claimed ahead: a holder frozen past its lease then holds at most ``in_flight`` claimed,
        unsent items, as many as it has slots, not twice that."""
        waiting = collections.deque(outs)
        queued: dict[Future[tuple[CallAnswer, bool]], OutgoingCall] = {}
        failure: BaseException | None = None
        abandoned = threading.Event()  # the holder stopped or was superseded: no more sends
        room = in_flight if lookup is None else in_flight - 1  # queued beyond the slots
        with ThreadPoolExecutor(in_flight, thread_name_prefix="external-call") as pool:
            try:
                while queued or (waiting and failure is None):
                    if failure is None and waiting and len(queued) <= room:
                        count = in_flight if lookup is None else in_flight - len(queued)
                        for out, row in self._claim_ahead(waiting, count, results):
                            job = pool.submit(self._resolve, out, row, send, lookup, abandoned)
                            queued[job] = out
                        if not queued:
                            continue
                    finished, _ = wait(queued, return_when=FIRST_COMPLETED)
                    answered, failed = _collect(finished, queued)
                    if failed is not None and failure is None:
                        failure = failed  # the first one is raised, after the rest
                        if isinstance(failed, StaleToken):  # superseded: the retries stop too
                            abandoned.set()
                        for later in queued:  # no further item is sent
                            later.cancel()
                    if answered:
                        results.update(self._record(answered, record))
            except BaseException:
                abandoned.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        if failure is not None:
            raise failure

    def _claim_ahead(
        self, waiting: collections.deque[OutgoingCall], count: int, results: dict[str, CallResult]
    ) -> list[tuple[OutgoingCall, dict[str, Any]]]:
        """Claims the next ``count`` waiting items: those to send, with their rows (the ones
        answered before go to ``results``)."""
        self._check()
        batch = [waiting.popleft() for _ in range(min(count, len(waiting)))]
        claimed = []
        for out, row in zip(batch, self._claim(batch), strict=True):
            if row["state"] != "intended":
                results[out.item] = _recorded(out.item, row)
            else:
                claimed.append((out, row))
        return claimed

    def _resolve(
        self,
        out: OutgoingCall,
        row: dict[str, Any],
        send: Send,
        lookup: Lookup | None,
        abandoned: threading.Event,
    ) -> tuple[CallAnswer, bool]:
        """A claimed item's answer and whether it was sent now: looked up first when an
        earlier holder (or try) may have reached the processor, else sent."""
        if row["sends"] > 1:
            if lookup is not None:
                found = lookup(out)
                if found is not None:
                    return checked_answer(found), False
            elif float(row["age_s"]) > self.replay_window_s:
                raise NeedsReconciliation(
                    f"{self.key}: {out.item!r} was intended {float(row['age_s']) / 3600:.1f} h "
                    "ago, longer than the processor keeps idempotency keys; check the processor "
                    "for it before running again"
                )
        answer = self._send(out, send, lookup, abandoned)
        return answer, not isinstance(answer, _Found)

    def _fence_bounds(self) -> dict[str, str]:
        """What fence_begin sets, for the fenced statements: the session is ended if it idles
        inside the answer's transaction, the advance waits at most ``lock_timeout``, the
        session is marked as the key's holder of this token (checked as fenced_transaction
        checks them).

        Raises:
            InvalidLeaseInput: bad key, token, generation or timeout.
        """
        check_key(self.key)
        token, generation = self.token, self.generation
        if isinstance(token, bool) or not isinstance(token, int) or token < 1:
            raise InvalidLeaseInput(f"a fencing token is a positive integer, not {token!r}")
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise InvalidLeaseInput(f"a ledger generation is an integer >= 0, not {generation!r}")
        if self.idle_timeout <= 0 or self.lock_timeout <= 0:
            raise InvalidLeaseInput("idle_timeout and lock_timeout must be positive")
        return {
            "idle": f"{round(self.idle_timeout * 1000)}ms",
            "lock": f"{round(self.lock_timeout * 1000)}ms",
            "mark": holder_mark(self.key, token),
        }

    def _claim(self, outs: list[OutgoingCall]) -> list[dict[str, Any]]:
        """Claims ``outs`` as intended in one fenced statement: each item's row, in order."""
        if self._bounds is None:
            self._bounds = self._fence_bounds()
        args = {
            **self._bounds,
            "key": self.key,
            "generation": self.generation,
            "items": [out.item for out in outs],
            "idempotency_keys": [out.idempotency_key for out in outs],
            "requests": [Jsonb(out.params) for out in outs],
            "token": self.token,
        }
        conn = self._connection()
        # the token check and the claims: one statement, one transaction (one round trip)
        rows = self._fenced(conn, lambda: self._rows(conn, "external_call_claim", args))
        claimed: list[dict[str, Any]] = []
        for out, row in zip(outs, rows, strict=True):
            if row["state"] is None:  # answered already: nothing to send
                row = self._get(conn, out.item)
            elif row["state"] == "intended" and not row["same_request"]:
                raise InvalidLeaseInput(
                    f"{self.key}: {out.item!r} was intended with other parameters than this "
                    "call's; an item's request must not change between holders (its "
                    "idempotency key would be refused)"
                )
            claimed.append(row)
        return claimed

    def _get(self, conn: psycopg.Connection[Any], item: str) -> dict[str, Any]:
        args = {"key": self.key, "generation": self.generation, "item": item}
        with conn.cursor(row_factory=dict_row) as cur:
            row: dict[str, Any] | None = cur.execute(query("external_call_get"), args).fetchone()
        assert row is not None
        return row

    def _send(
        self, out: OutgoingCall, send: Send, lookup: Lookup | None, abandoned: threading.Event
    ) -> CallAnswer:
        for attempt in range(self.retry.attempts):
            self._check()
            if abandoned.is_set():
                raise ProcessorUnavailable(f"{self.key}: {out.item!r} not sent: the holder stopped")
            if attempt > 0 and lookup is not None:
                # the failed send may have been made: a processor that does not replay by key
                # is asked before the item is sent again
                found = lookup(out)
                if found is not None:
                    answer = checked_answer(found)
                    return _Found(answer.state, answer.reference, answer.detail)
            try:
                return checked_answer(send(out))
            except ProcessorUnavailable:
                if attempt + 1 >= self.retry.attempts:
                    raise
                self._sleep(self.retry.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _record(
        self,
        answered: list[tuple[OutgoingCall, CallAnswer, bool]],
        record: Record | None,
    ) -> dict[str, CallResult]:
        """Records the answers in one fenced statement (with ``record``'s writes for each, in
        the same transaction): each item's result."""
        results = {
            out.item: CallResult(out.item, a.state, a.reference, dict(a.detail), sent)
            for out, a, sent in answered
        }
        assert self._bounds is not None  # set by the claim
        args = {
            **self._bounds,
            "key": self.key,
            "generation": self.generation,
            "items": [out.item for out, _, _ in answered],
            "states": [a.state for _, a, _ in answered],
            "references": [a.reference for _, a, _ in answered],
            "answers": [Jsonb(a.detail) for _, a, _ in answered],
            "token": self.token,
        }
        conn = self._connection()

        def recorded() -> set[str]:
            if record is None:
                # alone: one statement, its own transaction (one round trip)
                return set(self._rows(conn, "external_call_answer", args)[0]["answered"])
            with ExitStack() as ending, conn.transaction():
                # the fence, the answers and the ledger rows first, then the caller's writes,
                # all in one commit (bounded, as the statements are)
                done = set(self._rows(conn, "external_call_answer", args)[0]["answered"])
                for item, result in results.items():
                    if item in done:
                        record(
                            FencedWrite(
                                conn, self.key, self.token, self.generation, self.call_timeout
                            ),
                            result,
                        )
                ending.enter_context(WATCHDOG.bound(conn, self.call_timeout))
            return done

        done = self._fenced(conn, recorded)
        for item in (
            results.keys() - done
        ):  # recorded meanwhile (cannot happen under the fence; be exact)
            results[item] = _recorded(item, self._get(conn, item))
        return results

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._connect()
        # each fenced step is its own commit (the claim must be durable before the call
        # leaves): inside a caller's open transaction it would commit later, with theirs
        if not conn.autocommit:
            raise InvalidLeaseInput("external calls need an autocommit sink connection")
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise InvalidLeaseInput("an external call needs a connection with no open transaction")
        return conn

    def _rows(
        self, conn: psycopg.Connection[Any], name: str, args: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The rows of a fenced statement; StaleToken when the fence refused the token."""
        try:
            with (
                WATCHDOG.bound(conn, self.lock_timeout + self.call_timeout),
                conn.cursor(row_factory=dict_row) as cur,
            ):
                rows: list[dict[str, Any]] = cur.execute(query(name), args).fetchall()
        except psycopg.errors.LockNotAvailable as exc:
            raise _FenceLocked from exc
        assert rows
        if not rows[0]["fenced"]:
            raise StaleToken(self.key, self.token, fence_token(conn, self.key))
        return rows

    def _fenced(self, conn: psycopg.Connection[Any], run: Callable[[], _T]) -> _T:
        """``run`` (one fenced statement, or a transaction starting with one); when the
        key's fence row stays locked past the bound, the key's older holders frozen in their
        fenced transactions are ended and ``run`` is tried once more (as fenced_transaction
        does)."""
        ended_older = False
        while True:
            try:
                return run()
            except _FenceLocked:
                if ended_older:
                    raise FenceBusy(
                        self.key,
                        self.token,
                        f"its fence row stayed locked for {self.lock_timeout:.3g} s again",
                    ) from None
            # False: only this holder's own other transactions hold it; wait for them
            ended_older = _end_older_holders(conn, self.key, self.token, self.lock_timeout)


def _collect(
    finished: Iterable[Future[tuple[CallAnswer, bool]]],
    queued: dict[Future[tuple[CallAnswer, bool]], OutgoingCall],
) -> tuple[list[tuple[OutgoingCall, CallAnswer, bool]], BaseException | None]:
    """The answers of the ``finished`` calls (taken out of ``queued``) and the first error."""
    answered: list[tuple[OutgoingCall, CallAnswer, bool]] = []
    failure: BaseException | None = None
    for job in finished:
        out = queued.pop(job)
        if job.cancelled():  # claimed, never sent: stays intended
            continue
        try:
            answer, sent = job.result()
        except BaseException as exc:
            failure = failure or exc
            continue
        answered.append((out, answer, sent))
    return answered, failure


class _FenceLocked(Exception):
    """A fenced statement waited for the key's fence row past its bound."""


class _Found(CallAnswer):
    """An answer found by ``lookup`` rather than sent now."""


def _recorded(item: str, row: dict[str, Any]) -> CallResult:
    return CallResult(item, row["state"], row["reference"], dict(row["answer"] or {}), sent=False)


def _json_params(params: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise InvalidLeaseInput("an external call's params are a dict")
    try:
        normal: dict[str, Any] = json.loads(json.dumps(params, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise InvalidLeaseInput(f"an external call's params must be JSON: {exc}") from exc
    return normal


def recorded_calls(conn: psycopg.Connection[Any], keys: list[str]) -> list[dict[str, Any]]:
    """The external calls recorded under ``keys`` at a sink (item, request, state, reference)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(query("external_calls_of"), {"keys": keys}).fetchall())
