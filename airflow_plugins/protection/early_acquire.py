"""A protected try's acquire, started while Airflow still prepares the task.

Between rendering a task's templates and calling ``execute``, Airflow sends the rendered fields
through its supervisor, renders the map index and calls the running hooks; the acquire depends
on none of that. ``protected_try.start_early`` starts it on a thread once the templates are
rendered, and ``execute`` takes the answer (``take``), so the round trip overlaps Airflow's own.
Nothing changes in what is decided: the same statement for the same key and holder, acted on
exactly as ``execute``'s own (a stale grant is renewed first: ``Early.answer``; a try stopped
before ``execute`` releases it: ``release_unused``). A try that fails in Airflow's preparation
leaves its grant to the listener's failure hook and, at worst, to the lease's expiry. One
pending acquire per process (a task process runs one try).
"""

from __future__ import annotations

import _thread
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_plugins.lease import Acquisition, LeaseLost, LeaseStore, LeaseStoreUnavailable
from airflow_plugins.protection.task_identity import TaskTarget

log = logging.getLogger(__name__)

# a grant older than this when execute takes it is renewed before the body runs
STALE_AFTER = 1.0


class StoppedBeforeWork(Exception):
    """The try was told to stop after its early acquire, before ``execute`` took it."""


@dataclasses.dataclass
class Early:
    """One try's early acquire: the target it resolved, the store, and the answer to come."""

    ti: Any
    target: TaskTarget
    store: LeaseStore
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    got: Acquisition | None = None
    error: BaseException | None = None
    answered_at: float = 0.0

    def answer(self) -> Acquisition | None:
        """The acquire's answer (waiting for it); None when the grant went stale and another
        holder has the key now (the caller acquires again).

        Raises:
            Whatever the acquire raised (``LeaseStoreUnavailable``, ``InvalidLeaseInput``), as
            the caller's own acquire would have.
        """
        self.done.wait()
        if self.error is not None:
            raise self.error
        got = self.got
        assert got is not None
        if got.granted and time.monotonic() - self.answered_at > STALE_AFTER:
            try:
                self.store.renew(got.lease)
            except LeaseLost as exc:
                log.warning(
                    "exactly-once: %s: the early grant was lost before the work: %s", got.key, exc
                )
                return None
        return got


_pending: Early | None = None
_stopped: tuple[Any, str] | None = None  # the try's task instance, and why it was stopped
_lock = threading.Lock()


def start(
    ti: Any, target: TaskTarget, store: LeaseStore, acquire: Callable[[], Acquisition]
) -> bool:
    """Runs ``acquire`` (the acquire of ``target`` on ``store``) on a thread, for the try of
    task instance ``ti`` (the object Airflow hands both the rendering and ``execute``).

    Returns:
        Whether it started (False: one was started in this process already).
    """
    global _pending
    with _lock:
        if _pending is not None:
            return False
        pending = _pending = Early(ti, target, store)
    # started without waiting for the thread to run (see
    # airflow_plugins.protection.connection_warmup)
    _thread.start_new_thread(_run, (pending, acquire))
    return True


def _run(pending: Early, acquire: Callable[[], Acquisition]) -> None:
    try:
        pending.got = acquire()
    except BaseException as exc:  # handed to execute, which handles it as its own
        pending.error = exc
    finally:
        pending.answered_at = time.monotonic()
        pending.done.set()


def take(ti: Any) -> Early | None:
    """The early acquire of the try of ``ti``, once (None: there is none; acquire yourself).

    Raises:
        StoppedBeforeWork: the try was told to stop after its early acquire.
    """
    global _pending
    with _lock:
        if _stopped is not None and _stopped[0] is ti:
            raise StoppedBeforeWork(_stopped[1])
        if _pending is None or _pending.ti is not ti:
            return None
        pending, _pending = _pending, None
    return pending


def release_unused(reason: str) -> bool:
    """Releases an early grant that no ``execute`` took (the try is ending before its work).

    Returns whether one was released. Either way, the try's ``execute`` will not start the
    work (``take`` raises ``StoppedBeforeWork``).
    """
    global _pending, _stopped
    with _lock:
        pending, _pending = _pending, None
        if pending is None:
            return False
        _stopped = (pending.ti, f"{pending.target.key}: {reason}")
    if not pending.done.wait(timeout=5.0):
        return False
    got = pending.got
    if got is None or not got.granted:
        return False
    try:
        pending.store.release(got.lease, reason)
    except (LeaseLost, LeaseStoreUnavailable) as exc:  # the lease then expires
        log.warning("exactly-once: could not release %s: %s", got.key, exc)
        return False
    return True


def forget() -> None:
    """Drops the pending acquire, and a stop, without using them (tests)."""
    global _pending, _stopped
    with _lock:
        _pending = _stopped = None
