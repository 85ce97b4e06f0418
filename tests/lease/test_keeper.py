"""The lease keeper renews in the background and says when the lease is lost."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_plugins.lease import Holder, Lease, LeaseKeeper, LeaseLost, LeaseStore, Outcome
from tests.lease.ports import closed_port
from tests.lease.waiting import wait_for

KEY = "billing_nightly/charge/2024-02-15"


def _holder(n: int) -> Holder:
    return Holder.process(f"keeper-test-{n}")


def test_the_keeper_moves_the_expiry_forward_and_others_stay_out(store: LeaseStore) -> None:
    lease = store.acquire(KEY, _holder(1), ttl=1.0).lease
    lost: list[str] = []

    with LeaseKeeper(store, lease, interval=0.2, on_lost=lost.append) as keeper:
        # alive well past the TTL it was granted with
        wait_for(lambda: keeper.renewals >= 8, timeout=30)
        row = store.get(KEY)
        assert row is not None
        assert row["expires_at"] > lease.expires_at
        assert row["renewed_at"] is not None
        assert not row["expired"]
        assert store.acquire(KEY, _holder(2)).outcome is Outcome.HELD
        keeper.check()
    assert not keeper.lost
    assert lost == []
    store.complete(lease, {"ok": True})


def test_stop_waits_for_a_renewal_in_flight_and_none_starts_after(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stop() does not join the keeper's thread: it must still leave no renewal running that
    # could land after the caller completes the lease (and then declare it lost)
    lease = store.acquire(KEY, _holder(1), ttl=5.0).lease
    real_renew = store.renew
    ended: list[float] = []
    in_flight = threading.Event()

    def slow_renew(lease: Lease, **kwargs: Any) -> Any:
        in_flight.set()
        time.sleep(0.3)
        try:
            return real_renew(lease, **kwargs)
        finally:
            ended.append(time.monotonic())

    monkeypatch.setattr(store, "renew", slow_renew)
    keeper = LeaseKeeper(store, lease, interval=0.05).start()
    assert in_flight.wait(timeout=10)
    keeper.stop()
    stopped = time.monotonic()
    assert ended
    assert ended[-1] <= stopped  # the renewal in flight ended before stop returned
    renewals = len(ended)
    time.sleep(0.5)
    assert len(ended) == renewals  # and none started after it
    store.complete(lease, {"ok": True})  # still this holder's lease
    assert not keeper.lost


def test_a_force_release_is_noticed_and_on_lost_is_called_once(store: LeaseStore) -> None:
    lease = store.acquire(KEY, _holder(1), ttl=3.0).lease
    lost: list[str] = []
    called = threading.Event()

    def on_lost(reason: str) -> None:
        lost.append(reason)
        called.set()

    with LeaseKeeper(store, lease, interval=0.2, on_lost=on_lost) as keeper:
        store.force_release(KEY, actor="ops", reason="node drained")
        assert called.wait(timeout=30)
        assert keeper.lost
        with pytest.raises(LeaseLost, match="renew found another holder or none"):
            keeper.check()
    assert len(lost) == 1
    with pytest.raises(LeaseLost):
        store.complete(lease, {"ok": True})


def test_a_takeover_is_noticed_by_the_old_holders_keeper(store: LeaseStore) -> None:
    old = store.acquire(KEY, _holder(1), ttl=0.5).lease
    # the old holder was paused (no renewals) past its TTL and another took over
    wait_for(lambda: (store.get(KEY) or {}).get("expired"), timeout=10)
    new = store.acquire(KEY, _holder(2), ttl=30).lease
    assert new.token > old.token
    lost: list[str] = []

    with LeaseKeeper(store, old, interval=0.1, on_lost=lost.append) as keeper:
        # on_lost runs on the keeper's thread just after ``lost`` is set: wait for the call
        wait_for(lambda: lost, timeout=30)
        assert keeper.lost
    assert len(lost) == 1
    assert f"token {old.token}" in lost[0]
    row = store.get(KEY)
    assert row is not None
    assert row["token"] == new.token
    assert row["state"] == "running"


def test_a_keeper_that_cannot_reach_the_store_declares_the_lease_lost_by_its_expiry(
    store: LeaseStore,
) -> None:
    lease = store.acquire(KEY, _holder(1), ttl=2.0).lease
    lost: list[str] = []
    with LeaseStore(
        f"postgresql://postgres@127.0.0.1:{closed_port()}/x", connect_timeout=0.3
    ) as cut_off:
        with LeaseKeeper(cut_off, lease, interval=0.3, on_lost=lost.append) as keeper:
            wait_for(lambda: keeper.lost, timeout=30)
    assert len(lost) == 1
    assert "could not renew before expiry" in lost[0]


def test_the_renew_interval_must_be_shorter_than_the_ttl(store: LeaseStore) -> None:
    lease = store.acquire(KEY, _holder(1), ttl=1.0).lease
    for interval in (0, -1, 1.0, 5):
        with pytest.raises(ValueError, match="shorter than the TTL"):
            LeaseKeeper(store, lease, interval=interval)
