"""Fencing at the sink: the sink's own database refuses writes from a superseded holder.

No transaction spans the lease store and the sink, so the sink keeps its own fence: the highest
token seen per key (``runfence.fence``) and a ledger of done items unique on
(key, generation, item) (``runfence.ledger``). A fenced transaction (``fenced_transaction``)
advances the fence first, then runs the caller's writes and claims their ledger rows, and
commits all of it at once: a superseded holder fails at the fence before it writes anything,
a paused or frozen one cannot commit after the newer holder got through, and a taken-over run
finds the items already done in the ledger and skips them.
The fence's own statements and the commit are bounded on the client's clock
(``call_timeout``): a route that never answers cannot hold a holder past its lease.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg

from airflow_plugins.lease.call_watchdog import WATCHDOG
from airflow_plugins.lease.errors import FenceBusy, InvalidLeaseInput, StaleToken
from airflow_plugins.lease.keys import check_key
from airflow_plugins.lease.queries import query

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 10.0
# how long a fence advance waits for the key's row before ending older holders' sessions
DEFAULT_LOCK_TIMEOUT = 5.0
# how long it then waits for each such session to exit
TERMINATE_WAIT = 5.0
# how long each of the fence's own statements (and the commit) may wait for its answer
DEFAULT_CALL_TIMEOUT = 30.0
MAX_ITEM_CHARS = 512


def _check_item(item: object) -> str:
    if not isinstance(item, str) or not item or len(item) > MAX_ITEM_CHARS:
        raise InvalidLeaseInput(f"a ledger item is a string of 1 to {MAX_ITEM_CHARS} characters")
    return item


def idempotency_key(key: str, item: str, generation: int = 0) -> str:
    """A stable per-item idempotency key (for payment APIs and other HTTP sinks): the same for
    every holder of the key, its own for each re-run generation (an approved re-run sends
    anew instead of being replayed the first run's answer).

    Generation 0 keeps the form keys had before re-runs existed; a later one is prefixed by
    ``\x1d<generation>\x1d``, which no key (no control characters) can start with, so no
    two (key, item, generation) share a key.
    """
    prefix = "" if generation == 0 else f"\x1d{generation}\x1d"
    return hashlib.sha256(f"{prefix}{key}\x1f{item}".encode()).hexdigest()


def holder_mark(key: str, token: int) -> str:
    """The ``application_name`` of a session inside a fenced transaction of ``key`` and
    ``token`` (63 bytes at most, as Postgres keeps it; the key is hashed)."""
    return f"runfence {_key_hash(key)} {token}"


def _key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def http_headers(key: str, token: int, item: str, generation: int = 0) -> dict[str, str]:
    """Headers that carry the fence to an HTTP sink that checks it itself."""
    return {
        "Idempotency-Key": idempotency_key(key, item, generation),
        "X-Fencing-Token": str(token),
        "X-Lease-Key": key,
    }


class FencedWrite:
    """The open fenced transaction of one holder on one key, on the sink's connection.

    Use ``conn`` for the business writes, and ``claim`` each item before writing it. Items are
    claimed in the lease's re-run ``generation`` (0 until a re-run is approved).
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        key: str,
        token: int,
        generation: int = 0,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self.conn = conn
        self.key = key
        self.token = token
        self.generation = generation
        self.call_timeout = call_timeout

    def claim(self, item: str) -> bool:
        """Records ``item`` as done under this key; False means it was done already: skip it."""
        return bool(self.claim_many([item]))

    def claim_many(self, items: Iterable[str]) -> list[str]:
        """Claims many items at once; returns those that were not done yet (write only those)."""
        wanted = [_check_item(i) for i in items]
        with WATCHDOG.bound(self.conn, self.call_timeout):
            rows = self.conn.execute(
                query("ledger_claim"),
                {
                    "key": self.key,
                    "token": self.token,
                    "generation": self.generation,
                    "items": wanted,
                },
            ).fetchall()
        return [row[0] for row in rows]

    def done(self, items: Iterable[str]) -> set[str]:
        """The items of ``items`` already done under this key (by any holder)."""
        wanted = [_check_item(i) for i in items]
        with WATCHDOG.bound(self.conn, self.call_timeout):
            rows = self.conn.execute(
                query("ledger_done"),
                {"key": self.key, "generation": self.generation, "items": wanted},
            ).fetchall()
        return {row[0] for row in rows}

    def done_items(self) -> list[str]:
        """Every item done under this key by any holder (this transaction's claims included)."""
        return done_items(self.conn, self.key, self.generation)

    def headers(self, item: str) -> dict[str, str]:
        """Fence headers for an HTTP call that writes ``item``."""
        return http_headers(self.key, self.token, item, self.generation)


@contextmanager
def fenced_transaction(
    conn: psycopg.Connection[Any],
    key: str,
    token: int,
    *,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    generation: int = 0,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
) -> Iterator[FencedWrite]:
    """Opens a transaction on the sink connection that only the key's newest holder can commit.

    - a holder whose token was superseded fails at the fence, before it writes anything;
    - a holder paused *inside* its transaction holds the fence row; Postgres ends its session
      after ``idle_timeout`` (``idle_in_transaction_session_timeout``), so its commit fails and
      the new holder goes on;
    - a holder frozen *inside a statement* (mid-``COPY FROM STDIN``, SIGSTOP while the server
      waits on it) is not idle, so no idle timeout ends it: the newer holder's advance waits at
      most ``lock_timeout``, then ends the sessions of the key's older holders still in a fenced
      transaction (``pg_terminate_backend``: the sink role needs to be theirs or a member of
      ``pg_signal_backend``) and is tried once more. The frozen holder's transaction is rolled
      back, so it never commits after the newer holder got through; the newer holder is delayed
      by at most ``2 * lock_timeout + TERMINATE_WAIT`` (15 s by default) by older holders (the
      holder's own other transactions, same token, are waited for as long as they run, as any
      lock is).

    ``generation`` is the lease's (``Lease.generation``): an approved re-run claims its items
    in a new one, so it re-does each effect once.

    The fence's own statements and the commit each wait at most ``call_timeout`` for their
    answer (the advance ``lock_timeout`` more); past it the connection is ended and
    ``psycopg.OperationalError`` raised, the commit's fate unknown (a retry on a new connection
    finds the ledger's answer).

    Raises:
        StaleToken: a higher token has already written under ``key``; nothing was written.
        FenceBusy: the fence row stayed locked by a session that is not an older holder, or
            an older holder's session could not be ended (privilege); nothing was written.
        InvalidLeaseInput: bad key, token or timeout.
    """
    check_key(key)
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidLeaseInput(f"a fencing token is a positive integer, not {token!r}")
    if idle_timeout <= 0 or lock_timeout <= 0 or call_timeout <= 0:
        raise InvalidLeaseInput("idle_timeout, lock_timeout and call_timeout must be positive")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise InvalidLeaseInput(f"a ledger generation is an integer >= 0, not {generation!r}")
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        # inside an open transaction this would only be a savepoint: the fence and the writes
        # must commit together, on their own
        raise InvalidLeaseInput("fenced_transaction needs a connection with no open transaction")
    begin = {
        "idle": f"{round(idle_timeout * 1000)}ms",
        "lock": f"{round(lock_timeout * 1000)}ms",
        "mark": holder_mark(key, token),
    }
    ended_older = False
    while True:
        advanced = False
        try:
            # the commit (or the rollback) is bounded too: entered before the transaction
            # ends, left after it
            with ExitStack() as ending, conn.transaction():
                with WATCHDOG.bound(conn, lock_timeout + call_timeout):
                    row = conn.execute(query("fence_begin"), begin).fetchone()
                    prior = row[0] if row else "0"
                    advance = {"key": key, "token": token, "prior_lock_timeout": prior}
                    advanced_row = conn.execute(query("fence_advance_bounded"), advance)
                    if advanced_row.fetchone() is None:
                        current = conn.execute(query("fence_current"), {"key": key}).fetchone()
                        raise StaleToken(key, token, current[0] if current else None)
                advanced = True
                try:
                    yield FencedWrite(conn, key, token, generation, call_timeout)
                finally:
                    ending.enter_context(WATCHDOG.bound(conn, call_timeout))
            return
        except psycopg.errors.LockNotAvailable:
            if advanced:
                raise  # the caller's own write timed out on a lock: not the fence's
            if ended_older:
                raise FenceBusy(
                    key, token, f"its fence row stayed locked for {lock_timeout:.3g} s again"
                ) from None
        # False: only this holder's own other transactions hold it; wait for them as before
        ended_older = _end_older_holders(conn, key, token, lock_timeout)


def _end_older_holders(
    conn: psycopg.Connection[Any], key: str, token: int, lock_timeout: float
) -> bool:
    """Ends the key's older holders' sessions; True when it ended some, False when only the
    holder's own other transactions (same token) are there.

    Raises:
        StaleToken: a newer holder has written under the key.
        FenceBusy: no such session holds the row, or this role may not end one.
    """
    params = {"mark": _key_hash(key), "token": token, "wait_ms": round(TERMINATE_WAIT * 1000)}
    try:
        sessions = conn.execute(query("fence_end_older_holders"), params).fetchall()
    except psycopg.errors.InsufficientPrivilege as exc:
        raise FenceBusy(
            key,
            token,
            "an older holder's session holds its fence row and this role may not end it "
            "(make the sink role the holders' own, or GRANT pg_signal_backend TO it)",
        ) from exc
    ended = [row for row in sessions if row[1] is not None]
    if not ended and sessions:
        return False
    if not ended:
        current = fence_token(conn, key)
        if current is not None and current > token:
            raise StaleToken(key, token, current)
        raise FenceBusy(
            key,
            token,
            f"its fence row stayed locked for {lock_timeout:.3g} s by a session that is not "
            "an older holder's fenced transaction",
        )
    log.warning(
        "sink fence %s: token %s ended %s session(s) of older holders frozen in their fenced "
        "transaction (pids %s)",
        key,
        token,
        len(ended),
        ", ".join(str(r[0]) for r in ended),
    )
    return True


def advance_fence(conn: psycopg.Connection[Any], key: str, token: int) -> None:
    """Raises the key's fence to ``token`` now, before any work: older holders are refused.

    Raises:
        StaleToken: a higher token is already there.
    """
    with fenced_transaction(conn, key, token):
        pass


def fence_token(conn: psycopg.Connection[Any], key: str) -> int | None:
    """The highest token that has written under ``key`` at this sink, or None."""
    row = conn.execute(query("fence_current"), {"key": check_key(key)}).fetchone()
    return int(row[0]) if row else None


def done_items(conn: psycopg.Connection[Any], key: str, generation: int = 0) -> list[str]:
    """Every item done under ``key`` at this sink in ``generation``, by any holder, in order.

    A taken-over run skips the items an earlier holder did; its result should still describe
    the key's whole work (the billing of the night, not the last holder's part of it).
    """
    params = {"key": check_key(key), "generation": generation}
    rows = conn.execute(query("ledger_items"), params).fetchall()
    return [str(row[0]) for row in rows]
