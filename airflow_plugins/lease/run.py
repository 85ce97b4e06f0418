"""One body run under a held lease, the same for both engines.

The sink's fence is raised to the lease's token, a keeper renews the lease while the body runs,
and the body's outcome ends the lease: a returned result is recorded durably (retried while the
store is away, the keeper still renewing), an error fails the lease, a stop releases it. Airflow's
protected try and the bridge's activity both call ``run_under_lease``; each turns the errors
raised here into its engine's own (a retryable or a final task failure). The body's fence
carries the key's durable task state (``fence.state``), written only under this lease.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from airflow_plugins.lease.errors import (
    InvalidLeaseInput,
    LeaseError,
    LeaseLost,
    LeaseStoreUnavailable,
)
from airflow_plugins.lease.fence import Fence, FenceStopped
from airflow_plugins.lease.keeper import LeaseKeeper
from airflow_plugins.lease.store import Lease, LeaseStore
from airflow_plugins.lease.task_state import TaskState

log = logging.getLogger(__name__)

T = TypeVar("T")


class ResultNotRecorded(LeaseError):
    """The body returned but its result is not recorded: the work may run again.

    ``final`` is True when retrying cannot help (the result is too big or cannot be encoded);
    otherwise the next holder takes over and a fenced sink skips what this run did.
    """

    def __init__(self, message: str, *, final: bool) -> None:
        super().__init__(message)
        self.final = final


class PartialResult(FenceStopped):
    """The body was stopped inside its work and returned anyway: nothing was recorded."""


def _no_hook(_keeper: LeaseKeeper) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def run_under_lease(
    store: LeaseStore,
    fence: Fence,
    body: Callable[[Fence], T],
    *,
    interval: float | None = None,
    complete_timeout: float,
    encode: Callable[[T], Any] = lambda result: result,
    releases: Callable[[BaseException], str | None] = lambda exc: None,
    on_lost: Callable[[Fence, str], None] | None = None,
    while_running: Callable[[LeaseKeeper], AbstractContextManager[None]] = _no_hook,
) -> T:
    """Runs ``body(fence)`` under ``fence.lease`` and ends the lease with its outcome.

    Args:
        store: the lease store holding the lease.
        fence: the body's fence; its lease is the one held.
        body: the work.
        interval: seconds between the keeper's renewals (default: a third of the TTL).
        complete_timeout: how long a store that does not answer is retried when recording.
        encode: turns the result into what the lease records (raises ``TypeError`` when it
            cannot).
        releases: for an error the body raised, the reason to release the lease instead of
            failing it (the work was not done, e.g. the task skipped itself), or None.
        on_lost: called after the fence is stopped because the lease was lost mid-work.
        while_running: a context entered once the keeper runs and left when the body ends
            (an engine registers the run so it can stop it, or heartbeats).

    Raises:
        PartialResult: the body was stopped inside its work (told to, or the lease was lost)
            and returned anyway: its result is partial and not recorded; the lease is released
            if still held.
        ResultNotRecorded: the body returned but the result could not be recorded.
        BaseException: what the body raised, after the lease was failed or released.
    """
    lease = fence.lease
    assert lease is not None, "run_under_lease needs a protected fence"
    returned = threading.Event()

    def lost(reason: str) -> None:
        if returned.is_set():
            # the work is done: recording it is all that is left (the completion retries);
            # stopping or self-fencing now would only make the next holder run it again
            log.error("%s: lease in doubt while completing: %s", lease.key, reason)
            return
        fence.stop(f"lease lost: {reason}")
        if on_lost is not None:
            on_lost(fence, reason)

    keeper = LeaseKeeper(store, lease, interval=interval, on_lost=lost)
    fence.attach_state(TaskState(store, lease, check=fence.check))
    try:
        try:
            fence.advance_sink_fence()
            keeper.start()
            with while_running(keeper):
                result = body(fence)
            returned.set()
        except BaseException as exc:
            keeper.stop()
            if fence.stopped:
                if _still_ours_to_end(keeper):
                    _release(store, lease, f"stopped: {fence.stop_reason or 'told to stop'}")
            elif reason := releases(exc):
                _release(store, lease, reason)
            else:
                fail(store, lease, exc)
            raise
        finally:
            fence.close()
        if fence.stop_raised:
            # the body was stopped inside its work and returned anyway (it caught
            # FenceStopped): its result is partial; the next holder finishes from the ledger.
            # A body that returned without being stopped is recorded even if the keeper lost
            # the lease meanwhile: the completion is token-guarded, the store decides.
            reason = fence.stop_reason or "told to stop"
            keeper.stop()
            if _still_ours_to_end(keeper):
                _release(store, lease, f"the fence was stopped while the work ran: {reason}")
            raise PartialResult(lease.key, lease.token, reason)
        complete_durably(store, lease, result, encode=encode, timeout=complete_timeout)
        return result
    finally:
        keeper.stop()


def complete_durably(
    store: LeaseStore,
    lease: Lease,
    result: Any,
    *,
    encode: Callable[[Any], Any] = lambda result: result,
    timeout: float,
) -> None:
    """Records a returned body's result, retrying a store that does not answer.

    A blip or a failover is retried with backoff (the caller's keeper renews meanwhile) for up
    to ``timeout`` seconds, so the run ends recorded rather than failed for want of a record.

    Raises:
        ResultNotRecorded: the result cannot be encoded or stored (``final``), the lease was
            lost, or the store stayed away past ``timeout``.
    """
    try:
        value = encode(result)
    except TypeError as exc:
        fail(store, lease, InvalidLeaseInput(str(exc)))
        raise ResultNotRecorded(
            f"{lease.key}: the result cannot be recorded ({exc}); return a value that can be "
            "serialized (the lease hands it to every later run of this business date)",
            final=True,
        ) from exc
    give_up = time.monotonic() + timeout
    for delay in _backoff():
        try:
            store.complete(lease, value)
            return
        except InvalidLeaseInput as exc:
            fail(store, lease, exc)
            raise ResultNotRecorded(
                f"{lease.key}: the result cannot be recorded ({exc}); return a small value "
                "(the lease hands it to every later run of this business date)",
                final=True,
            ) from exc
        except LeaseLost as exc:
            log.error("%s: the work returned but its lease is gone: %s", lease.key, exc)
            raise ResultNotRecorded(
                f"{lease.key}: the work returned but could not be recorded: {exc}", final=False
            ) from exc
        except LeaseStoreUnavailable as exc:
            if time.monotonic() + delay > give_up:
                log.error("%s: completion not recorded: %s", lease.key, exc)
                raise ResultNotRecorded(
                    f"{lease.key}: the work returned but the lease store stayed away for "
                    f"{timeout:g} s: {exc}",
                    final=False,
                ) from exc
            log.warning(
                "%s: lease store away while completing, retrying in %.1f s: %s",
                lease.key,
                delay,
                exc,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def _backoff() -> Iterator[float]:
    delay = 0.1
    while True:
        yield delay
        delay = min(2.0, delay * 2)


def fail(store: LeaseStore, lease: Lease, exc: BaseException) -> None:
    """Fails the lease with the error's text; a lease already gone is only logged."""
    try:
        store.fail(lease, f"{type(exc).__name__}: {exc}")
    except (LeaseLost, LeaseStoreUnavailable) as err:
        log.warning("could not fail %s: %s", lease.key, err)


def _still_ours_to_end(keeper: LeaseKeeper) -> bool:
    """Whether a stopped run releases its lease: yes when it was told to stop or its engine
    gave it up (the body has ended, so the next holder may start at once); no when the keeper
    lost the lease on its own (it may be another's now, or the process is being self-fenced:
    its children may still run, so expiry decides)."""
    return not keeper.lost or keeper.abandoned


def _release(store: LeaseStore, lease: Lease, reason: str) -> None:
    try:
        store.release(lease, reason)
    except (LeaseLost, LeaseStoreUnavailable) as err:
        # released by whoever stopped it, or lost to another holder: nothing of ours to end
        log.info("not releasing %s: %s", lease.key, err)
