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
import concurrent.futures
import enum
from typing import Any, Protocol

ASK_TIMEOUT_S = 5.0


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

    def ask(self, info: Any) -> Attempt:
        """Describes the activity's workflow and finds the attempt among its pending ones."""
        future = asyncio.run_coroutine_threadsafe(self._ask(info), self._loop)
        try:
            return future.result(timeout=ASK_TIMEOUT_S)
        except (concurrent.futures.TimeoutError, Exception):
            future.cancel()
            return Attempt.UNKNOWN

    async def _ask(self, info: Any) -> Attempt:
        handle = self._client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
        description = await handle.describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_id == info.activity_id:
                return Attempt.WANTED if pending.attempt == info.attempt else Attempt.GIVEN_UP
        return Attempt.GIVEN_UP
