"""The lease keeper: renews a held lease in the background and says when it is lost.

Self-fencing is a courtesy, not the guarantee (the sinks' fences are): when the keeper cannot
confirm the lease before it would expire, it declares it lost and calls ``on_lost`` so the work
stops instead of writing into refusals.

The deadline is the keeper's own clock, not an answer from the store: a renewal confirmed by
the store extends the lease to at least (when the renewal was sent) + TTL on the server, so the
keeper declares the lease lost at that send time + TTL - ``margin`` (``LOST_MARGIN`` of the
TTL), before the server can grant the key to anyone else, whether or not a renewal is still
waiting on a dead connection (a second thread watches the clock). Failed renewals are retried
with a jittered exponential backoff from an eighth of the interval, never in a tight loop.
"""

from __future__ import annotations

import _thread
import logging
import random
import threading
import time
from collections.abc import Callable
from types import TracebackType

from airflow_plugins.lease.errors import LeaseLost, LeaseStoreUnavailable
from airflow_plugins.lease.store import Lease, LeaseStore

log = logging.getLogger(__name__)

# the share of the TTL by which the keeper declares a lease lost before the server could let
# it expire: room for the clocks' rates, a late wake-up and the fence's stop
LOST_MARGIN = 0.2


class LeaseKeeper:
    """Renews ``lease`` every ``interval`` seconds on a background thread.

    Use as a context manager around the work; check ``lost`` (or call ``check()``) between
    items. ``on_lost`` runs once, on the keeper's thread, when the lease is lost.

    Args:
        store: the lease store.
        lease: the held lease.
        interval: seconds between renewals (default: a third of the TTL).
        on_lost: called with the reason when the lease is lost.

    Attributes:
        margin: seconds before the server's earliest expiry at which the lease is declared
            lost when no renewal was confirmed (``LOST_MARGIN`` of the TTL).
    """

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        *,
        interval: float | None = None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self._abandoned = False
        self._store = store
        self.lease = lease
        self.interval = interval if interval is not None else lease.ttl / 3
        if not 0 < self.interval < lease.ttl:
            raise ValueError("the renew interval must be positive and shorter than the TTL")
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._lost = threading.Event()
        # set by stop() or a lost lease: the renewing thread's wait ends at once
        self._halt = threading.Event()
        # held while a renewal is in flight: stop() waits for it, and none starts after stop()
        self._renewing = threading.Lock()
        self._declaring = threading.Lock()
        # the clock thread waits on it; notified when the deadline moves or the keeper stops
        self._clock = threading.Condition(threading.Lock())
        self._thread_ids: set[int] = set()
        self.lost_reason: str | None = None
        self.renewals = 0
        self.failures = 0  # renewals failed in a row
        self._last_error = ""
        self.margin = lease.ttl * LOST_MARGIN
        # when the server's expiry was last pushed to at least (this + TTL): the acquire's or
        # the last confirmed renewal's send time
        sent = lease.asked_at if lease.asked_at is not None else time.monotonic()
        self._deadline = sent + lease.ttl

    @property
    def lost(self) -> bool:
        """True once the lease is known (or feared) lost."""
        return self._lost.is_set()

    def check(self) -> None:
        """Raises LeaseLost when the lease is lost; call it between items of work."""
        if self._lost.is_set():
            raise LeaseLost(self.lease.key, self.lease.token, self.lost_reason or "")

    def start(self) -> LeaseKeeper:
        """Starts renewing.

        The thread comes from ``_thread``, not ``threading.Thread``, whose ``start`` waits until
        the new thread has run: on a busy host that is a millisecond or more of a task's time,
        for a thread whose first act is to sleep for the interval.
        """
        self._thread_ids.add(_thread.start_new_thread(self._run, ()))
        self._thread_ids.add(_thread.start_new_thread(self._watch, ()))
        return self

    @property
    def lost_at(self) -> float:
        """``time.monotonic()`` at which the lease is declared lost unless a renewal is
        confirmed first: ``margin`` before the server's earliest expiry."""
        return self._deadline - self.margin

    def stop(self) -> None:
        """Stops renewing (the lease stays as it is: complete, fail or release it).

        Returns once no renewal is in flight and none can start; the thread then ends on its
        own. Safe to call from ``on_lost`` (on a keeper's thread). A renewal in flight is
        bounded in time by the store (the lease's deadline), so this wait is too.
        """
        self._stop.set()
        self._halt.set()
        with self._clock:
            self._clock.notify_all()
        if threading.get_ident() not in self._thread_ids:
            with self._renewing:
                pass

    def abandon(self, reason: str) -> None:
        """Gives the lease up because this holder's own engine gave it up: stops renewing and
        declares the lease lost (``lost``, ``check()``, ``on_lost``), as if a renewal had failed.

        For a holder that can tell it is no longer wanted while it can still reach the store,
        e.g. a Temporal activity whose heartbeats fail: its engine schedules a retry elsewhere,
        which is answered ``held`` for as long as this keeper renews. After ``abandon`` the
        lease expires within its TTL and the retry takes over with a higher token; this
        holder's fenced writes are refused from then on. The lease is not released: the work
        may still be running, and expiry is what makes the takeover safe to detect.
        """
        self._abandoned = True
        self.stop()
        self._declare_lost(reason)

    @property
    def abandoned(self) -> bool:
        """True once ``abandon`` gave the lease up (as opposed to losing it)."""
        return self._abandoned

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _declare_lost(self, reason: str) -> None:
        with self._declaring:
            if self._lost.is_set():
                return
            self.lost_reason = reason
            self._lost.set()
        self._halt.set()
        log.error("lease %s token %s lost: %s", self.lease.key, self.lease.token, reason)
        if self._on_lost is not None:
            try:
                self._on_lost(reason)
            except Exception:
                log.exception("on_lost callback failed")

    def _run(self) -> None:
        while not self._halt.wait(self._next_wait()):
            lost = self._renew_once()
            if lost is not None:
                # outside the renewal lock: on_lost may stop this keeper
                self._declare_lost(lost)
                return

    def _watch(self) -> None:
        # the keeper's own clock: declares the lease lost at lost_at, even while a renewal
        # hangs on a connection that will never answer
        with self._clock:
            while not self._halt.is_set():
                remaining = self.lost_at - time.monotonic()
                if remaining <= 0:
                    break
                self._clock.wait(remaining)
        if not self._halt.is_set():
            why = f": {self._last_error}" if self._last_error else ""
            self._declare_lost(
                f"token {self.lease.token}: could not renew before expiry (no renewal "
                f"confirmed within {self.lease.ttl - self.margin:.3g} s){why}"
            )

    def _renew_once(self) -> str | None:
        """One renewal; returns why the lease is lost, if it is."""
        with self._renewing:
            if self._stop.is_set():
                return None
            started = time.monotonic()
            try:
                # bounded by the deadline: past it the lease is lost whatever the answer
                self._store.renew(self.lease, timeout=max(0.1, self.lost_at - started))
            except LeaseLost as exc:
                return str(exc)
            except LeaseStoreUnavailable as exc:
                self.failures += 1
                self._last_error = str(exc)
                if time.monotonic() >= self.lost_at:
                    return f"token {self.lease.token}: could not renew before expiry: {exc}"
                log.warning("lease %s: renew failed, retrying: %s", self.lease.key, exc)
                return None
            if self._lost.is_set():
                return None  # declared lost meanwhile: a late answer does not revive it
            with self._clock:
                # the new expiry counts from when the renew was sent, not when it answered
                self._deadline = started + self.lease.ttl
                self._clock.notify_all()
            self.failures = 0
            self._last_error = ""
            self.renewals += 1
            return None

    def _next_wait(self) -> float:
        """Seconds until the next renewal: the interval after a success; after failures, a
        jittered backoff from an eighth of the interval, doubling, at most the interval. Never
        past ``lost_at`` (the clock declares the lease lost there) and never zero."""
        if self.failures == 0:
            wait = self.interval
        else:
            backoff = self.interval / 8 * 2 ** min(self.failures - 1, 16)
            wait = min(self.interval, backoff) * random.uniform(0.5, 1.0)
        until_lost = self.lost_at - time.monotonic()
        # a renewal is still tried ahead of lost_at, a tenth of the interval ahead at least
        return max(self.interval / 10, min(wait, until_lost - self.interval / 10))
