"""Asks Temporal, from an activity's heartbeat thread, whether it still wants this attempt.

A worker cut off from Temporal but not from the lease store would renew its lease for as long
as its code runs, while Temporal times the attempt out and retries it elsewhere: every retry is
answered ``held``. The SDK cancels such an attempt only once it hears from the server again. So
the heartbeat thread asks the server itself (the workflow's pending activities name the attempt
Temporal is waiting for); an attempt that is no longer the one, or that cannot reach Temporal
for longer than its heartbeat timeout, gives its lease up (``LeaseKeeper.abandon``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Any, Protocol

from temporalio.service import RPCError, RPCStatusCode

log = logging.getLogger(__name__)
ASK_TIMEOUT_S = 5.0
# the statuses that mean "could not reach the server", not "the server said no"
_UNREACHABLE = {
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.CANCELLED,
    RPCStatusCode.UNKNOWN,
    RPCStatusCode.RESOURCE_EXHAUSTED,
}


class Attempt(enum.Enum):
    """What Temporal says of an activity attempt."""

    WANTED = "wanted"  # still the attempt Temporal waits for
    GIVEN_UP = "given_up"  # retried elsewhere, or its workflow is closed
    UNKNOWN = "unknown"  # Temporal could not be asked


class AttemptWatch(Protocol):
    """Answers whether Temporal still wants the attempt ``info`` describes."""

    def ask(self, info: Any) -> Attempt:
        """Asks once; never raises."""


class TemporalAttemptWatch:
    """An ``AttemptWatch`` over the worker's client, run on the worker's event loop.

    Args:
        client: the worker's Temporal client.
        loop: the event loop the client runs on (the worker's).
    """

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop
        self._refused: str | None = None

    def ask(self, info: Any) -> Attempt:
        """Describes the activity's workflow and finds the attempt among its pending ones.

        Only a server that cannot be reached (or answers too late) is ``UNKNOWN``. A server
        that refuses the question (no permission to describe, not implemented) cannot tell
        either way: the watch then answers ``WANTED`` from then on, and says so once in the
        log, so a refusal never stops work.
        """
        if self._refused is not None:
            return Attempt.WANTED
        question = self._ask(info)
        try:
            future = asyncio.run_coroutine_threadsafe(question, self._loop)
        except RuntimeError:  # the worker's loop is closed: nobody can ask any more
            question.close()
            return Attempt.UNKNOWN
        try:
            return future.result(timeout=ASK_TIMEOUT_S)
        except RPCError as exc:
            if exc.status in _UNREACHABLE:
                return Attempt.UNKNOWN
            self._refused = f"{exc.status.name}: {exc.message}"
            log.warning(
                "bridge: Temporal refuses to describe workflows (%s): a given-up attempt is "
                "noticed only when the SDK cancels it",
                self._refused,
            )
            return Attempt.WANTED
        except Exception:  # timed out, or the connection is gone
            future.cancel()
            return Attempt.UNKNOWN

    async def _ask(self, info: Any) -> Attempt:
        handle = self._client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
        description = await handle.describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_id == info.activity_id:
                return Attempt.WANTED if pending.attempt == info.attempt else Attempt.GIVEN_UP
        return Attempt.GIVEN_UP
