"""The triggers, driven directly: serialize() round trips, run() against the real lease store.

``LeaseStoreReachableTrigger`` is shown an outage and a recovery: it points at a port of B's
range where a TCP relay to the real Postgres is started only after the trigger began waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.protection.triggers import LeaseReleasedTrigger, LeaseStoreReachableTrigger
from tests.airflow.conftest import free_port

KEY = "billing_nightly/charge/2024-02-15"


def _rebuilt(trigger: Any) -> Any:
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def test_serialize_returns_the_exact_classpath_and_round_trips() -> None:
    released = LeaseReleasedTrigger(key=KEY, token=7, poll_interval=0.5)
    assert released.serialize() == (
        "airflow_plugins.protection.triggers.LeaseReleasedTrigger",
        {
            "key": KEY,
            "token": 7,
            "poll_interval": 0.5,
            "dsn": None,
            "conn_id": None,
            "not_before": None,
        },
    )
    assert _rebuilt(released).serialize() == released.serialize()
    own = LeaseReleasedTrigger(key=KEY, token=7, conn_id="team_leases")
    assert own.serialize()[1]["conn_id"] == "team_leases"
    assert _rebuilt(own).serialize() == own.serialize()
    reachable = LeaseStoreReachableTrigger(poll_interval=2.0)
    assert reachable.serialize() == (
        "airflow_plugins.protection.triggers.LeaseStoreReachableTrigger",
        {"poll_interval": 2.0, "dsn": None, "conn_id": None, "not_before": None},
    )
    assert _rebuilt(reachable).serialize() == reachable.serialize()
    later = LeaseStoreReachableTrigger(not_before=1_900_000_000.5)
    assert _rebuilt(later).serialize()[1]["not_before"] == 1_900_000_000.5


async def _first_event(trigger: Any, *, quiet_for: float, then: Any, timeout: float = 20) -> Any:
    """Asserts the trigger stays quiet for ``quiet_for`` s, runs ``then``, returns its event."""
    events: AsyncIterator[Any] = trigger.run()
    pending = asyncio.ensure_future(events.__anext__())
    await asyncio.sleep(quiet_for)
    assert not pending.done(), "the trigger fired while the condition did not hold"
    await then()
    return await asyncio.wait_for(pending, timeout)


@pytest.mark.parametrize("end", ["complete", "fail", "release"])
def test_released_trigger_fires_when_the_holder_finishes(lease_db: str, end: str) -> None:
    with LeaseStore(lease_db, ttl=30) as store:
        lease = store.acquire(KEY, Holder.process("holder")).lease
        trigger = LeaseReleasedTrigger(key=KEY, token=lease.token, poll_interval=0.1, dsn=lease_db)

        async def finish() -> None:
            if end == "complete":
                await asyncio.to_thread(store.complete, lease, {"ok": 1})
            elif end == "fail":
                await asyncio.to_thread(store.fail, lease, "boom")
            else:
                await asyncio.to_thread(store.release, lease)

        event = asyncio.run(_first_event(trigger, quiet_for=0.5, then=finish))
    expected = {"complete": "succeeded", "fail": "failed", "release": "released"}[end]
    assert event.payload == {
        "status": "released",
        "key": KEY,
        "token": lease.token,
        "state": expected,
    }


def test_released_trigger_fires_when_the_holder_dies_and_its_lease_expires(lease_db: str) -> None:
    with LeaseStore(lease_db) as store:
        lease = store.acquire(KEY, Holder.process("dies"), ttl=1.5).lease
    trigger = LeaseReleasedTrigger(key=KEY, token=lease.token, poll_interval=0.1, dsn=lease_db)

    async def nothing() -> None:
        return None

    event = asyncio.run(_first_event(trigger, quiet_for=0.3, then=nothing))
    assert event.payload["state"] == "expired"


def test_released_trigger_keeps_waiting_while_the_holder_renews(lease_db: str) -> None:
    with LeaseStore(lease_db) as store:
        lease = store.acquire(KEY, Holder.process("alive"), ttl=1.0).lease
        trigger = LeaseReleasedTrigger(key=KEY, token=lease.token, poll_interval=0.1, dsn=lease_db)

        async def renew_past_ttl_then_complete() -> None:
            for _ in range(8):  # 2.4 s: well past the 1 s TTL, kept alive by renewals
                await asyncio.to_thread(store.renew, lease)
                await asyncio.sleep(0.3)
            await asyncio.to_thread(store.complete, lease, None)

        event = asyncio.run(_first_event(trigger, quiet_for=0.2, then=renew_past_ttl_then_complete))
    assert event.payload["state"] == "succeeded"


class _Relay:
    """A TCP relay to the real Postgres on a port of B's range: "the store comes back"."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def start(self, port: int) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port)

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def test_reachable_trigger_waits_through_an_outage(lease_db: str) -> None:
    from airflow_plugins.protection import config

    real = psycopg.conninfo.conninfo_to_dict(lease_db)
    port = free_port()
    dsn = psycopg.conninfo.make_conninfo(lease_db, host="127.0.0.1", port=port, connect_timeout=1)
    trigger = LeaseStoreReachableTrigger(poll_interval=0.2, dsn=dsn)
    relay = _Relay(str(real.get("host", "127.0.0.1")), int(real.get("port", 5432)))

    async def scenario() -> Any:
        try:
            return await _first_event(trigger, quiet_for=2.0, then=lambda: relay.start(port))
        finally:
            # the trigger's store keeps a pooled connection through the relay: close it first
            with config._stores_lock:
                stores = [s for k, s in config._stores.items() if k[0] == dsn]
            for store in stores:
                await asyncio.to_thread(store.close)
            await relay.close()

    event = asyncio.run(scenario())
    assert event.payload == {"status": "reachable"}


def test_triggers_report_a_missing_configuration_instead_of_waiting_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__LEASE_CONN_ID", "missing_conn")

    async def first(trigger: Any) -> Any:
        return await asyncio.wait_for(trigger.run().__anext__(), 20)

    released = asyncio.run(first(LeaseReleasedTrigger(key=KEY, token=1, poll_interval=0.1)))
    assert released.payload["status"] == "error"
    assert "missing_conn" in released.payload["error"]
    reachable = asyncio.run(first(LeaseStoreReachableTrigger(poll_interval=0.1)))
    assert reachable.payload["status"] == "error"


def test_a_released_lease_does_not_fire_before_not_before(lease_db: str) -> None:
    # Airflow 3.3 fails a deferred try resumed too soon: the wait lasts at least until
    # not_before, even when the lease is free from the start
    with LeaseStore(lease_db, ttl=30) as store:
        lease = store.acquire(KEY, Holder.process("holder")).lease
        store.complete(lease, {"ok": 1})
        trigger = LeaseReleasedTrigger(
            key=KEY,
            token=lease.token,
            poll_interval=0.1,
            dsn=lease_db,
            not_before=time.time() + 1.5,
        )

        async def nothing() -> None:
            return None

        event = asyncio.run(_first_event(trigger, quiet_for=1.0, then=nothing))
    assert event.payload["state"] == "succeeded"
