"""The lease store: run-leases with fencing tokens in Postgres.

Every state change is one SQL statement (``sql/queries.sql``; the uncommon acquire outcomes in
the functions of ``sql/migrations``) that locks or inserts the key's row, decides, draws the
token after it holds the row, and writes the audit row in the same transaction. Python never
decides ownership from a value it read earlier.

The hot path (acquire, renew, finish) runs on one connection the store keeps, with tuple rows
and the holder serialised once; a second thread meanwhile is served from a small pool.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from airflow_plugins.lease import audit_payload
from airflow_plugins.lease.agent_client import AgentClient
from airflow_plugins.lease.connections import DEFAULT_CALL_TIMEOUT, StoreConnections
from airflow_plugins.lease.errors import InvalidLeaseInput, LeaseLost
from airflow_plugins.lease.holder import Holder
from airflow_plugins.lease.keys import check_key
from airflow_plugins.lease.masking import mask_text
from airflow_plugins.lease.queries import query

DEFAULT_TTL = 60.0
DEFAULT_HORIZON_DAYS = 400
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
# retention moves and deletes many rows: its calls get longer than the store's call_timeout
RETENTION_TIMEOUT = 3600.0


class Outcome(enum.StrEnum):
    """What an acquire decided."""

    GRANTED = "granted"
    TAKEN_OVER = "taken_over"
    HELD = "held"
    SUCCEEDED = "succeeded"
    REFUSED = "refused"


@dataclasses.dataclass(frozen=True)
class Lease:
    """A lease this caller holds: pass it to renew/complete/fail/release and to sinks."""

    key: str
    token: int
    attempt: int
    holder: Holder
    ttl: float
    expires_at: datetime
    business_date: date | None = None
    # time.monotonic() when the acquire was sent: the server's expiry is at least this plus
    # the TTL, so the keeper counts its deadline from here (None: from when it starts)
    asked_at: float | None = None
    # the key's re-run generation: sinks claim this lease's items in it (0 until a re-run of
    # the key is approved; each approval opens the next)
    generation: int = 0


@dataclasses.dataclass(frozen=True)
class Acquisition:
    """The answer to an acquire.

    Attributes:
        outcome: granted / taken_over (the caller holds the lease now), held (wait), succeeded
            (do not run; ``result`` is the recorded result), refused (never run; see ``detail``).
        token: the caller's new token, or the current holder's / the succeeded run's token.
        holder: the caller, or who holds / held the key.
        expires_at: when the lease expires (the caller's, or the live holder's).
    """

    key: str
    outcome: Outcome
    token: int | None
    attempt: int | None
    holder: Holder | None
    expires_at: datetime | None
    result: Any = None
    previous_holder: Holder | None = None
    previous_token: int | None = None
    detail: str | None = None
    ttl: float = DEFAULT_TTL
    business_date: date | None = None
    asked_at: float | None = None
    generation: int = 0

    @property
    def granted(self) -> bool:
        """True when the caller holds the lease (granted or taken over)."""
        return self.outcome in (Outcome.GRANTED, Outcome.TAKEN_OVER)

    @property
    def lease(self) -> Lease:
        """The lease the caller now holds.

        Raises:
            LeaseLost: the acquire did not grant the lease.
        """
        if not self.granted or self.token is None or self.attempt is None:
            raise LeaseLost(self.key, self.token or 0, f"acquire answered {self.outcome}")
        assert self.holder is not None
        assert self.expires_at is not None
        return Lease(
            self.key,
            self.token,
            self.attempt,
            self.holder,
            self.ttl,
            self.expires_at,
            self.business_date,
            self.asked_at,
            self.generation,
        )


def check_ttl(ttl: object) -> float:
    """Validates a TTL in seconds: a finite number of at least 0.1.

    Raises:
        InvalidLeaseInput: the TTL is zero, negative, not finite or not a number.
    """
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise InvalidLeaseInput(f"a lease TTL must be a number of seconds, not {ttl!r}")
    if not math.isfinite(ttl) or ttl < 0.1:
        raise InvalidLeaseInput(f"a lease TTL must be a finite number >= 0.1 s, not {ttl!r}")
    if ttl > 7 * 24 * 3600:
        raise InvalidLeaseInput("a lease TTL must be at most 7 days; renew it instead")
    return float(ttl)


def _check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidLeaseInput(f"a fencing token is a positive integer, not {token!r}")
    return token


def _holder(data: Mapping[str, Any] | None) -> Holder | None:
    return Holder.from_json(dict(data)) if data else None


class LeaseStore:
    """Run-leases on one Postgres database.

    Args:
        conninfo: a libpq connection string or URL for the lease store's database.
        ttl: default lease TTL in seconds.
        horizon_days: acquires of keys with no record and a business date older than this are
            refused (the compact succeeded record is kept at least this long).
        max_audit_bytes: inputs and outputs larger than this are recorded as a digest.
        max_result_bytes: a result larger than this is refused by ``complete``.
        pool_size: most connections this store opens at once (one it keeps for the hot path,
            the others pooled for calls made while that one is busy).
        connect_timeout: seconds to wait for a connection before failing closed.
        call_timeout: seconds a call may wait for its answer; past it the connection is ended
            and the call fails closed (``LeaseStoreUnavailable``). The keeper's renewals are
            bounded by the lease's own deadline, which is shorter.
        agent_socket: the Unix socket of a lease agent (``airflow_plugins.lease.agent``) that
            runs the hot statements (acquire, renew, finish) on its warm connections; when no
            agent listens there, or it serves another store, they run on the store's own.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        ttl: float = DEFAULT_TTL,
        horizon_days: int = DEFAULT_HORIZON_DAYS,
        max_audit_bytes: int = audit_payload.DEFAULT_MAX_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        pool_size: int = 4,
        connect_timeout: float = 5.0,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        agent_socket: str | None = None,
    ) -> None:
        self.ttl = check_ttl(ttl)
        if horizon_days < 1:
            raise InvalidLeaseInput("horizon_days must be at least 1")
        self.horizon_days = horizon_days
        self.max_audit_bytes = max_audit_bytes
        self.max_result_bytes = max_result_bytes
        if pool_size < 1:
            raise InvalidLeaseInput("pool_size must be at least 1")
        self._connections = StoreConnections(
            conninfo,
            pool_size=pool_size,
            connect_timeout=connect_timeout,
            call_timeout=call_timeout,
        )
        # the connection of a serialized() block, for calls made on that block's thread
        self._serializing = threading.local()
        # the agent's own wait for a connection, the statement, and a margin
        self.agent = (
            AgentClient(agent_socket, conninfo, timeout=2 * connect_timeout + 5)
            if agent_socket
            else None
        )

    # -- plumbing -----------------------------------------------------------------------------

    @contextmanager
    def connection(
        self, timeout: float | None = None
    ) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """An autocommit connection with dict rows; failures to reach Postgres fail closed.

        The store's kept connection when it is free, else one from its pool. The block is
        bounded by ``timeout`` (default: the store's ``call_timeout``).

        Raises:
            LeaseStoreUnavailable: Postgres could not be reached, dropped the connection or
                did not answer in time.
        """
        held: psycopg.Connection[dict[str, Any]] | None = getattr(self._serializing, "conn", None)
        if held is not None:
            yield held
            return
        with self._connections.connection(timeout) as conn:
            yield conn

    @contextmanager
    def serialized(self, key: str) -> Iterator[LeaseStore]:
        """One transaction holding ``key``'s advisory lock, for a read-then-record of its audit.

        Observers that read a key's history and then record on it (the listener's DAG-run
        events, which two schedulers may fire at once) see each other's rows instead of both
        deciding from the same history. Lease transitions do not take this lock: they lock the
        lease row. Calls on this store made on this thread inside the block run in the
        transaction and commit together at its end.

        Raises:
            InvalidLeaseInput: a bad key.
            LeaseStoreUnavailable: the store did not answer (nothing was recorded).
        """
        check_key(key)
        with self._connections.connection() as conn, conn.transaction():
            conn.execute(query("lock_key"), {"key": key})
            self._serializing.conn = conn
            try:
                yield self
            finally:
                self._serializing.conn = None

    def _rows(
        self, name: str, params: Mapping[str, Any], *, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        with self.connection(timeout) as conn:
            return conn.execute(query(name), params).fetchall()

    def _tuples(
        self, name: str, params: Mapping[str, Any], *, timeout: float | None = None
    ) -> list[tuple[Any, ...]]:
        # the hot path: tuple rows, no per-row dict; through the agent when there is one
        if self.agent is not None and getattr(self._serializing, "conn", None) is None:
            rows = self.agent.tuples(name, params)
            if rows is not None:
                return rows
        with self.connection(timeout) as conn, conn.cursor(row_factory=tuple_row) as cursor:
            return cursor.execute(query(name), params).fetchall()

    def warm_up(self) -> bool:
        """Opens the store's kept connection and prepares a holder's try on it without writing
        anything: runs the finish of a token no lease has, so the try's acquire and finish find
        the connection open, most of the server's catalog loaded (the lease table, the audit
        table) and psycopg's type caches filled.

        The acquire itself is not planned ahead: an ``EXPLAIN`` of it cost a new backend more
        server CPU than it saved the try's acquire.

        Runs in the calling thread; call it from a thread of its own
        (``airflow_plugins.protection.connection_warmup``): calls made from other threads
        meanwhile wait for the connection it opens.
        A failure is only logged; the next call reports it.

        With a lease agent's socket in place, nothing is warmed: the try's statements go to the
        agent, whose connections are warm (asking it here would only cost it a request). The
        store's own connection is warmed when there is no such socket; a try whose agent turns
        out dead or refuses it connects cold.

        Returns:
            whether the warm-up's statement ran (or an agent's socket is there).
        """
        if self.agent is not None and self.agent.listening():
            return True
        # tokens start at 1: this finish matches no lease and writes no audit row
        nothing = {
            "key": "warm-up",
            "token": 0,
            "state": "succeeded",
            "result": "null",
            "output": "null",
            "error": "",
            "holder": "{}",
        }
        return self._connections.warm([(query("finish"), nothing)])

    def close(self) -> None:
        """Closes the store's connections."""
        self._connections.close()

    def __enter__(self) -> LeaseStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- holder operations --------------------------------------------------------------------

    def acquire(
        self,
        key: str,
        holder: Holder,
        *,
        ttl: float | None = None,
        business_date: date | None = None,
        input: Any = None,
    ) -> Acquisition:
        """Asks for the lease of ``key``; the database decides the outcome under the row lock.

        Args:
            key: the business identity, e.g. ``billing_nightly/charge/2024-02-15``.
            holder: who asks.
            ttl: seconds until the lease expires unless renewed (default: the store's).
            business_date: the business date the key stands for; enables the retention check.
            input: what the work is given, for the audit (masked and size-limited).

        Raises:
            InvalidLeaseInput: bad key or TTL; nothing was written.
            LeaseStoreUnavailable: fail closed; no lease was taken.
        """
        check_key(key)
        ttl = self.ttl if ttl is None else check_ttl(ttl)
        params = {
            "key": key,
            "holder": holder.json_text,
            "ttl_ms": round(ttl * 1000),
            "business_date": business_date,
            "horizon_days": self.horizon_days,
            "input": self._audit_json(input),
        }
        asked_at = time.monotonic()
        # a new key is granted by one plain statement; anything else is decided by the
        # store's function (a second round trip, only when the first granted nothing)
        rows = self._tuples("acquire", params) or self._tuples("acquire_decided", params)
        return self._with_generation(
            self._acquisition(key, rows[0], ttl, business_date, holder, asked_at)
        )

    def _with_generation(self, got: Acquisition) -> Acquisition:
        """``got`` with the granted lease's re-run generation.

        A first grant is generation 0; a later one may follow an approved re-run (one more
        round trip, for retries and re-runs only). The granted row's generation cannot change
        while it runs.

        Raises:
            LeaseLost: the grant was superseded before its generation could be read (writing
                in generation 0 then would skip a re-run's items).
        """
        if not got.granted or (got.attempt or 1) <= 1:
            return got
        rows = self._rows("lease_generation", {"key": got.key, "token": got.token})
        if not rows:
            raise LeaseLost(got.key, int(got.token or 0), "superseded right after its grant")
        return dataclasses.replace(got, generation=int(rows[0]["generation"]))

    def acquire_many(
        self,
        keys: Sequence[str],
        holder: Holder,
        *,
        ttl: float | None = None,
        business_date: date | None = None,
    ) -> list[Acquisition]:
        """Acquires many keys for one holder in one round trip and one transaction.

        Returns one acquisition per distinct key, in key order.
        """
        for key in keys:
            check_key(key)
        ttl = self.ttl if ttl is None else check_ttl(ttl)
        asked_at = time.monotonic()
        rows = self._tuples(
            "acquire_batch",
            {
                "keys": list(keys),
                "holder": holder.json_text,
                "ttl_ms": round(ttl * 1000),
                "business_date": business_date,
                "horizon_days": self.horizon_days,
            },
        )
        return [
            self._with_generation(
                self._acquisition(row[0], row[1:], ttl, business_date, holder, asked_at)
            )
            for row in rows
        ]

    def renew(
        self, lease: Lease, *, ttl: float | None = None, timeout: float | None = None
    ) -> datetime:
        """Extends the lease; returns the new expiry.

        Args:
            lease: the held lease.
            ttl: the new TTL (default: the lease's).
            timeout: seconds to wait for the answer (default: the store's ``call_timeout``).

        Raises:
            LeaseLost: the lease was taken over or released; stop the work.
            LeaseStoreUnavailable: the store did not answer; the lease may still be held.
        """
        ttl = lease.ttl if ttl is None else check_ttl(ttl)
        rows = self._tuples(
            "renew",
            {"key": lease.key, "token": lease.token, "ttl_ms": round(ttl * 1000)},
            timeout=timeout,
        )
        if not rows:
            raise LeaseLost(lease.key, lease.token, "renew found another holder or none")
        expires_at: datetime = rows[0][0]
        return expires_at

    def complete(self, lease: Lease, result: Any = None) -> None:
        """Marks the key succeeded with ``result`` (handed to later acquires of the key).

        Raises:
            InvalidLeaseInput: the result is not JSON-serialisable or too large; nothing written.
            LeaseLost: the caller no longer holds the lease.
        """
        value = audit_payload.to_json_value(result, what="a lease result")
        text = json.dumps(value)
        if len(text) > self.max_result_bytes:
            raise InvalidLeaseInput(
                f"a lease result must be at most {self.max_result_bytes} bytes of JSON, "
                f"not {len(text)}; store large outputs elsewhere and return a reference"
            )
        output = audit_payload.audit_text(value, max_bytes=self.max_audit_bytes, plain_json=True)
        self._finish(lease, "succeeded", result=text, output=output, error=None)

    def fail(self, lease: Lease, error: str) -> None:
        """Marks the key failed: the next acquire is granted with a new token.

        Raises:
            LeaseLost: the caller no longer holds the lease.
        """
        # an exception's text can carry a DSN or a token: the lease row and the audit get it masked
        self._finish(lease, "failed", result=None, output=None, error=mask_text(error)[:2000])

    def release(self, lease: Lease, reason: str = "released by holder") -> None:
        """Gives the lease up without a result (the work stopped): the next acquire is granted.

        Raises:
            LeaseLost: the caller no longer holds the lease.
        """
        self._finish(lease, "released", result=None, output=None, error=mask_text(reason)[:2000])

    def _finish(
        self,
        lease: Lease,
        state: str,
        *,
        result: str | None,
        output: str | None,
        error: str | None,
    ) -> None:
        _check_token(lease.token)
        rows = self._tuples(
            "finish",
            {
                "key": lease.key,
                "token": lease.token,
                "state": state,
                "result": result,
                "output": output,
                "error": error,
                "holder": lease.holder.json_text,
            },
        )
        if not rows:
            raise LeaseLost(lease.key, lease.token, f"could not mark it {state}")

    def _audit_json(self, value: Any) -> str | None:
        # JSON text, cast to jsonb by the query: serialised once, not again by an adapter
        return audit_payload.audit_text(value, max_bytes=self.max_audit_bytes)

    def _acquisition(
        self,
        key: str,
        row: Sequence[Any],
        ttl: float,
        business_date: date | None,
        caller: Holder,
        asked_at: float | None = None,
    ) -> Acquisition:
        # row: outcome, token, attempt, holder, expires_at, result, previous_holder,
        # previous_token, detail, held_by_caller (queries.sql: acquire, acquire_batch).
        # A row the caller holds does not send the holder back: the caller's is reused.
        (outcome, token, attempt, stored, expires_at, result, previous, previous_token, detail,
         mine) = row  # fmt: skip
        return Acquisition(
            key=key,
            outcome=Outcome(outcome),
            token=token,
            attempt=attempt,
            holder=caller if mine else _holder(stored),
            expires_at=expires_at,
            result=result,
            previous_holder=_holder(previous),
            previous_token=previous_token,
            detail=detail,
            ttl=ttl,
            business_date=business_date,
            asked_at=asked_at,
        )

    # -- administration (each needs an actor and a reason; each is audited) --------------------

    def force_release(self, key: str, *, actor: str, reason: str) -> int | None:
        """Releases a running lease whoever holds it; returns the token it had, or None."""
        check_key(key)
        rows = self._admin("force_release", key=key, actor=actor, reason=reason)
        return rows[0]["token"] if rows else None

    def approve_rerun(
        self, key: str, *, actor: str, reason: str, business_date: date | None = None
    ) -> str:
        """Lets a succeeded (or pruned) key be granted once more.

        Returns ``approved``, or ``not_needed`` when the key is failed or released already.
        """
        check_key(key)
        rows = self._admin(
            "approve_rerun", key=key, actor=actor, reason=reason, business_date=business_date
        )
        approved: str = rows[0]["approve_rerun"]
        return approved

    def fail_on_behalf(
        self,
        key: str,
        match: Mapping[str, Any],
        *,
        actor: str,
        reason: str,
        silent_for: float | None = None,
    ) -> int | None:
        """Fails the running lease of the try whose holder contains ``match``.

        Args:
            key: the lease key.
            match: holder fields the lease's holder must contain.
            actor: who fails it (audited).
            reason: why (audited).
            silent_for: fail it only if it was not renewed for this many seconds (its holder
                is shown gone by its missed renewals); decided in the same statement.

        Returns the failed token, or None when that try does not hold the lease (any more),
        or still renewed it within ``silent_for``.
        """
        check_key(key)
        if not match:
            raise InvalidLeaseInput("fail_on_behalf needs holder fields to match")
        if silent_for is None:
            rows = self._admin(
                "fail_on_behalf", key=key, match=Jsonb(dict(match)), actor=actor, reason=reason
            )
        else:
            rows = self._admin(
                "fail_on_behalf_if_silent",
                key=key,
                match=Jsonb(dict(match)),
                actor=actor,
                reason=reason,
                silent_ms=round(silent_for * 1000),
            )
        return rows[0]["token"] if rows else None

    def _admin(self, name: str, **params: Any) -> list[dict[str, Any]]:
        actor, reason = str(params.get("actor") or ""), str(params.get("reason") or "")
        if not actor.strip() or not reason.strip():
            raise InvalidLeaseInput("an administrative change needs an actor and a reason")
        params["reason"] = mask_text(reason)
        try:
            return self._rows(name, params)
        except psycopg.errors.ObjectInUse as exc:
            raise InvalidLeaseInput(str(exc.diag.message_primary)) from exc

    def record_event(
        self,
        key: str,
        event: str,
        *,
        outcome: str,
        holder: Holder | None = None,
        token: int | None = None,
        attempt: int | None = None,
        business_date: date | None = None,
        input: Any = None,
        output: Any = None,
        duration_ms: int | None = None,
        actor: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Writes an audit row that is not a lease transition (an observed run, a duplicate)."""
        check_key(key)
        self._rows(
            "record",
            {
                "key": key,
                "event": event,
                "token": token,
                "holder": holder.json_text if holder else None,
                "attempt": attempt,
                "business_date": business_date,
                "input": self._audit_json(input),
                "output": self._audit_json(output),
                "duration_ms": duration_ms,
                "outcome": outcome,
                "actor": actor,
                "reason": None if reason is None else mask_text(reason),
            },
        )

    # -- retention ----------------------------------------------------------------------------

    def ensure_audit_partitions(self, start: date, until: date) -> int:
        """Creates the monthly audit partitions from ``start`` to ``until`` (idempotent).

        Rows the default partition holds for such a month are moved into it.

        Returns:
            How many partitions were created.
        """
        rows = self._rows(
            "ensure_audit_partitions", {"from": start, "until": until}, timeout=RETENTION_TIMEOUT
        )
        made: int = rows[0]["ensure_audit_partitions"]
        return made

    def prune(self, *, audit_keep_months: int = 13) -> tuple[int, int]:
        """Drops audit months older than ``audit_keep_months`` and lease rows past the horizon.

        The keys of pruned lease rows are refused from then on (the prune floor), never
        granted again by mistake.

        Returns:
            (audit partitions dropped, lease rows deleted).
        """
        if audit_keep_months < 1:
            raise InvalidLeaseInput("audit_keep_months must be at least 1")
        rows = self._rows(
            "prune",
            {"horizon_days": self.horizon_days, "audit_keep_months": audit_keep_months},
            timeout=RETENTION_TIMEOUT,
        )
        return int(rows[0]["dropped_partitions"]), int(rows[0]["pruned_leases"])

    # -- reading ------------------------------------------------------------------------------

    def get(self, key: str) -> dict[str, Any] | None:
        """The lease row of ``key`` (with an ``expired`` flag), or None."""
        check_key(key)
        rows = self._rows("get_lease", {"key": key})
        return rows[0] if rows else None

    def list_leases(
        self,
        *,
        prefix: str | None = None,
        state: str | None = None,
        expired_only: bool = False,
        taken_over_only: bool = False,
        dags: Collection[str] | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Lease rows, newest first, filtered by key prefix, state, expiry, takeovers and the
        DAGs they belong to (``dags``: None for all)."""
        return self._rows(
            "list_leases",
            {
                "prefix": prefix,
                "state": state,
                "expired_only": expired_only,
                "taken_over_only": taken_over_only,
                "dags": None if dags is None else sorted(dags),
                "limit": limit,
            },
        )

    def recent_outcomes(
        self,
        outcomes: Sequence[str],
        *,
        hours: int = 24,
        prefix: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Audit rows of acquires that ended in one of ``outcomes`` (e.g. refused, held)."""
        return self._rows(
            "recent_audit_outcomes",
            {"outcomes": list(outcomes), "hours": hours, "prefix": prefix, "limit": limit},
        )

    def history(self, key: str) -> list[dict[str, Any]]:
        """Every audit row of ``key``, oldest first."""
        check_key(key)
        return self._rows("history", {"key": key})

    def audit_by_date(
        self,
        business_date: date,
        *,
        prefix: str | None = None,
        outcome: str | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """Audit rows of one business date, optionally of keys under ``prefix``."""
        return self._rows(
            "audit_by_date",
            {"business_date": business_date, "prefix": prefix, "outcome": outcome, "limit": limit},
        )
