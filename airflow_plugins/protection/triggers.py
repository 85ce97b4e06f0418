"""Triggers a protected task defers on: it waits in the triggerer, holding no worker slot.

``LeaseReleasedTrigger`` waits until a held lease is no longer running (completed, failed,
released) or has expired (the holder died: a takeover is due). ``LeaseStoreReachableTrigger``
waits until the lease store answers again. Both fire one event; the task then acquires again,
so the database, not the trigger, decides who runs. The store is polled in a worker thread
(psycopg's sync pool), never on the triggerer's event loop.

Neither fires before ``not_before`` (``[exactly_once] wait_at_least`` after the task deferred,
an absolute time, so a triggerer restart does not start it over): Airflow 3.3 fails a deferred
try resumed before the scheduler has handled the executor's event of the process that deferred
(apache/airflow#71580, #72716), which would cost the resumed try a retry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plugins.lease import InvalidLeaseInput, LeaseStore, LeaseStoreUnavailable
from airflow_plugins.protection import config

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT = 3.0


def _store(dsn: str | None, conn_id: str | None = None) -> LeaseStore:
    return config.lease_store(
        dsn or config.lease_dsn(conn_id=conn_id), connect_timeout=_CONNECT_TIMEOUT
    )


async def _not_before(moment: float | None) -> None:
    """Sleeps until ``moment`` (epoch seconds), if it is still ahead."""
    if moment is not None and (ahead := moment - time.time()) > 0:
        await asyncio.sleep(ahead)


class _StorePollTrigger(BaseTrigger):
    """Polls the lease store from the triggerer until ``_check`` has an event to fire.

    Args:
        poll_interval: seconds between checks.
        dsn: the lease store's DSN (default: the configured store, resolved in the triggerer, so
            no credentials travel in the trigger's stored arguments).
        conn_id: the task's own lease-store Connection, if it has one (resolved in the
            triggerer).
        not_before: epoch seconds before which it does not fire (see the module).
    """

    def __init__(
        self,
        poll_interval: float = 5.0,
        dsn: str | None = None,
        conn_id: str | None = None,
        not_before: float | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.poll_interval = poll_interval
        self.dsn = dsn
        self.conn_id = conn_id
        self.not_before = not_before

    def _arguments(self) -> dict[str, Any]:
        return {
            "poll_interval": self.poll_interval,
            "dsn": self.dsn,
            "conn_id": self.conn_id,
            "not_before": self.not_before,
        }

    def _identity(self) -> dict[str, Any]:
        """What every event of this trigger carries."""
        return {}

    def _check(self) -> dict[str, Any] | None:
        """The event's payload once it may fire, else None (runs on a thread)."""
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and arguments that rebuild this trigger in the triggerer."""
        return f"{type(self).__module__}.{type(self).__qualname__}", self._arguments()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Polls until the check has an event, then yields it; a store not configured in the
        triggerer yields an error event."""
        await _not_before(self.not_before)
        while True:
            try:
                payload = await asyncio.to_thread(self._check)
            except InvalidLeaseInput as exc:
                yield TriggerEvent(  # type: ignore[no-untyped-call]
                    {"status": "error", **self._identity(), "error": str(exc)}
                )
                return
            if payload is not None:
                yield TriggerEvent(payload)  # type: ignore[no-untyped-call]
                return
            await asyncio.sleep(self.poll_interval)


class LeaseReleasedTrigger(_StorePollTrigger):
    """Fires when the lease of ``key`` is no longer held by a live holder.

    Args:
        key: the lease key the task waits for.
        token: the token that held it when the task deferred (for the logs and the event).
        poll_interval, dsn, conn_id, not_before: as for every store-polling trigger.
    """

    def __init__(
        self,
        key: str,
        token: int,
        poll_interval: float = 5.0,
        dsn: str | None = None,
        conn_id: str | None = None,
        not_before: float | None = None,
    ) -> None:
        super().__init__(poll_interval, dsn, conn_id, not_before)
        self.key = key
        self.token = token

    def _arguments(self) -> dict[str, Any]:
        return {"key": self.key, "token": self.token, **super()._arguments()}

    def _identity(self) -> dict[str, Any]:
        return {"key": self.key}

    def _check(self) -> dict[str, Any] | None:
        try:
            row = _store(self.dsn, self.conn_id).get(self.key)
        except LeaseStoreUnavailable as exc:
            log.warning("waiting for %s: lease store unavailable: %s", self.key, exc)
            return None
        if row is None:
            state = "gone"
        elif row["state"] != "running":
            state = str(row["state"])
        elif row["expired"]:
            state = "expired"
        else:
            return None
        return {"status": "released", "key": self.key, "token": self.token, "state": state}


class LeaseStoreReachableTrigger(_StorePollTrigger):
    """Fires when the lease store answers a query again (arguments: see ``_StorePollTrigger``)."""

    def _check(self) -> dict[str, Any] | None:
        try:
            _store(self.dsn, self.conn_id).list_leases(limit=1)  # any named query proves it answers
        except LeaseStoreUnavailable as exc:
            log.info("lease store still unavailable: %s", exc)
            return None
        return {"status": "reachable"}
