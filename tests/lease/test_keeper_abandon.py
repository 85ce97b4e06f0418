"""A holder whose own engine gave it up stops renewing: its retry gets the key once the lease
expires, even though the old attempt was never cancelled and its process lives on."""

from __future__ import annotations

import pytest

from airflow_plugins.lease import Holder, LeaseKeeper, LeaseLost, LeaseStore, Outcome
from tests.lease.waiting import wait_for

KEY = "billing_nightly/charge/2024-02-15"


def test_an_abandoned_keeper_stops_renewing_and_the_retry_takes_over(store: LeaseStore) -> None:
    old = Holder.temporal(workflow_id="wf", workflow_run_id="r1", activity_id="charge", attempt=1)
    retry = Holder.temporal(workflow_id="wf", workflow_run_id="r1", activity_id="charge", attempt=2)
    lease = store.acquire(KEY, old, ttl=1.0).lease
    lost: list[str] = []
    keeper = LeaseKeeper(store, lease, interval=0.2, on_lost=lost.append).start()
    try:
        wait_for(lambda: keeper.renewals >= 3)
        # the engine scheduled the retry: while the old attempt renews, the retry waits
        assert store.acquire(KEY, retry, ttl=1.0).outcome is Outcome.HELD
        # the old attempt's heartbeats fail (cut off from its engine): it gives itself up
        keeper.abandon("heartbeats to Temporal failing")
        assert keeper.lost
        with pytest.raises(LeaseLost):
            keeper.check()
        assert lost == ["heartbeats to Temporal failing"]
        renewed = keeper.renewals
        # the retry gets the key once the lease expires (nobody renews it any more)
        got = wait_for(lambda: (a := store.acquire(KEY, retry, ttl=5.0)).granted and a, timeout=30)
        assert got.outcome is Outcome.TAKEN_OVER
        assert got.token is not None
        assert got.token > lease.token
        assert keeper.renewals == renewed
        store.complete(got.lease, {"charged": 60})
        # the old attempt, still running, cannot record anything
        with pytest.raises(LeaseLost):
            store.complete(lease, {"charged": 12})
    finally:
        keeper.stop()
    row = store.get(KEY)
    assert row is not None
    assert (row["state"], row["token"], row["result"]) == ("succeeded", got.token, {"charged": 60})
