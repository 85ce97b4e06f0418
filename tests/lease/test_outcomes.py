"""Every acquire outcome, and the holder operations, on the real lease store."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import psycopg
import pytest

from airflow_plugins.lease import Holder, LeaseLost, LeaseStore, Outcome
from airflow_plugins.lease.keys import lease_key
from tests.lease.waiting import wait_for

KEY = str(lease_key("billing_nightly", "charge", "2024-02-15"))


def _holder(try_number: int, run_id: str = "scheduled__2024-02-15") -> Holder:
    return Holder.airflow(
        dag_id="billing_nightly", run_id=run_id, task_id="charge", try_number=try_number
    )


def _expired(store: LeaseStore, key: str) -> bool:
    row = store.get(key)
    return bool(row and row["expired"])


def test_first_acquire_is_granted_with_a_token_and_a_lease_row(store: LeaseStore) -> None:
    got = store.acquire(KEY, _holder(1), ttl=30)

    assert got.outcome is Outcome.GRANTED
    assert got.granted
    assert got.token is not None
    assert got.token >= 1
    assert got.attempt == 1
    assert got.holder == _holder(1)
    row = store.get(KEY)
    assert row is not None
    assert row["state"] == "running"
    assert row["token"] == got.token
    assert row["holder"] == _holder(1).to_json()
    assert row["expires_at"] == got.expires_at
    assert timedelta(seconds=29) < got.expires_at - datetime.now(UTC) <= timedelta(seconds=31)


def test_a_live_holder_makes_others_wait_and_says_who_and_until_when(store: LeaseStore) -> None:
    first = store.acquire(KEY, _holder(1), ttl=30)

    second = store.acquire(KEY, _holder(1, run_id="manual__2024-02-16"))

    assert second.outcome is Outcome.HELD
    assert not second.granted
    assert second.holder == _holder(1)
    assert second.expires_at == first.expires_at
    assert second.token == first.token
    with pytest.raises(LeaseLost):
        _ = second.lease
    row = store.get(KEY)
    assert row is not None
    assert row["token"] == first.token
    assert row["attempt"] == 1


def test_a_succeeded_key_hands_back_its_result_and_grants_nothing(store: LeaseStore) -> None:
    lease = store.acquire(KEY, _holder(1)).lease
    store.complete(lease, {"charged": 340, "total_cents": 8_200_000})

    again = store.acquire(KEY, _holder(2))

    assert again.outcome is Outcome.SUCCEEDED
    assert not again.granted
    assert again.result == {"charged": 340, "total_cents": 8_200_000}
    assert again.token == lease.token
    assert again.holder == _holder(1)
    row = store.get(KEY)
    assert row is not None
    assert (row["state"], row["token"], row["attempt"]) == ("succeeded", lease.token, 1)


def test_an_expired_holder_is_taken_over_with_a_higher_token(store: LeaseStore) -> None:
    old = store.acquire(KEY, _holder(1), ttl=0.3).lease
    wait_for(lambda: _expired(store, KEY), timeout=10)

    new = store.acquire(KEY, _holder(2), ttl=30)

    assert new.outcome is Outcome.TAKEN_OVER
    assert new.token is not None
    assert new.token > old.token
    assert new.attempt == 2
    assert new.previous_holder == _holder(1)
    assert new.previous_token == old.token
    row = store.get(KEY)
    assert row is not None
    assert (row["token"], row["takeovers"], row["holder"]) == (new.token, 1, _holder(2).to_json())
    takeover = [r for r in store.history(KEY) if r["outcome"] == "taken_over"]
    assert len(takeover) == 1
    assert takeover[0]["token"] == new.token
    assert f"from token {old.token}" in takeover[0]["reason"]


def test_failed_and_released_keys_are_granted_again_with_higher_tokens(
    store: LeaseStore,
) -> None:
    first = store.acquire(KEY, _holder(1)).lease
    store.fail(first, "payment processor timed out")
    second = store.acquire(KEY, _holder(2))
    assert second.outcome is Outcome.GRANTED
    assert second.token is not None
    assert second.token > first.token
    assert second.detail == "previous attempt failed"

    store.release(second.lease, "worker shutting down")
    third = store.acquire(KEY, _holder(3))
    assert third.outcome is Outcome.GRANTED
    assert third.token is not None
    assert third.token > second.token
    assert third.attempt == 3


def test_the_same_holder_asking_again_gets_its_own_lease_back(store: LeaseStore) -> None:
    first = store.acquire(KEY, _holder(1), ttl=2)

    again = store.acquire(KEY, _holder(1), ttl=30)

    assert again.outcome is Outcome.GRANTED
    assert again.token == first.token
    assert again.detail == "already held by this holder"
    assert again.expires_at is not None
    assert first.expires_at is not None
    assert again.expires_at > first.expires_at
    row = store.get(KEY)
    assert row is not None
    assert row["token"] == first.token
    assert row["attempt"] == 1
    store.complete(again.lease, {"ok": True})
    assert store.acquire(KEY, _holder(1)).outcome is Outcome.SUCCEEDED


def test_a_date_older_than_the_horizon_is_refused_and_leaves_no_record(lease_db: str) -> None:
    old = date.today() - timedelta(days=401)
    key = str(lease_key("billing_nightly", "charge", old.isoformat()))
    with LeaseStore(lease_db, horizon_days=400) as store:
        got = store.acquire(key, _holder(1), business_date=old)

        assert got.outcome is Outcome.REFUSED
        assert got.token is None
        assert got.detail is not None
        assert "retention horizon" in got.detail
        assert store.get(key) is None
        assert [r["outcome"] for r in store.history(key)] == ["refused"]
        # a date inside the horizon is granted
        recent = date.today() - timedelta(days=399)
        ok = store.acquire(
            str(lease_key("b", "c", recent.isoformat())), _holder(1), business_date=recent
        )
        assert ok.outcome is Outcome.GRANTED
        # an administrator approves the old date once, with a reason: then it is granted
        assert (
            store.approve_rerun(
                key, actor="carol@finance", reason="late invoice correction", business_date=old
            )
            == "approved"
        )
        approved = store.acquire(key, _holder(2), business_date=old)
        assert approved.outcome is Outcome.GRANTED
        assert approved.attempt == 1
        # from now on the key has a record: held while it runs, succeeded once done
        assert store.acquire(key, _holder(3), business_date=old).outcome is Outcome.HELD
        assert [(r["event"], r["outcome"], r["actor"]) for r in store.history(key)] == [
            ("acquire", "refused", None),
            ("approve_rerun", "approved", "carol@finance"),
            ("acquire", "granted", None),
            ("acquire", "held", None),
        ]


def test_a_pruned_key_is_refused_not_granted_again(lease_db: str) -> None:
    old = date.today() - timedelta(days=450)
    key = str(lease_key("billing_nightly", "charge", old.isoformat()))
    # a store with a long horizon ran and completed the old date
    with LeaseStore(lease_db, horizon_days=3650) as long_store:
        long_store.complete(long_store.acquire(key, _holder(1), business_date=old).lease, {"n": 1})
        assert long_store.acquire(key, _holder(2), business_date=old).outcome is Outcome.SUCCEEDED
    with LeaseStore(lease_db, horizon_days=400) as store:
        _dropped, pruned = store.prune(audit_keep_months=12)
        assert pruned == 1
        assert store.get(key) is None
    # even a store configured with a longer horizon cannot grant below the prune floor
    with LeaseStore(lease_db, horizon_days=3650) as long_store:
        again = long_store.acquire(key, _holder(3), business_date=old)
        assert again.outcome is Outcome.REFUSED
        assert long_store.get(key) is None
        # and an administrator can approve it once, with a reason
        assert (
            long_store.approve_rerun(
                key, actor="ops@example.com", reason="restated invoice", business_date=old
            )
            == "approved"
        )
        rerun = long_store.acquire(key, _holder(4), business_date=old)
        assert rerun.outcome is Outcome.GRANTED
        assert rerun.token is not None
        assert rerun.token > (again.token or 0)


def test_approve_rerun_grants_a_succeeded_key_exactly_once_more(store: LeaseStore) -> None:
    first = store.acquire(KEY, _holder(1)).lease
    store.complete(first, {"charged": 340})

    assert store.approve_rerun(KEY, actor="alice@finance", reason="INC-4711 re-bill") == "approved"
    rerun = store.acquire(KEY, _holder(2))
    assert rerun.outcome is Outcome.GRANTED
    assert rerun.token is not None
    assert rerun.token > first.token
    assert rerun.detail == "re-run approved by an administrator"
    # the approval is used up: a third run is held, then succeeded, never granted
    assert store.acquire(KEY, _holder(3)).outcome is Outcome.HELD
    store.complete(rerun.lease, {"charged": 340})
    assert store.acquire(KEY, _holder(3)).outcome is Outcome.SUCCEEDED
    approval = [r for r in store.history(KEY) if r["event"] == "approve_rerun"]
    assert len(approval) == 1
    assert (approval[0]["actor"], approval[0]["reason"]) == ("alice@finance", "INC-4711 re-bill")


def test_a_superseded_token_cannot_complete_fail_or_release(store: LeaseStore) -> None:
    old = store.acquire(KEY, _holder(1), ttl=0.3).lease
    wait_for(lambda: _expired(store, KEY), timeout=10)
    new = store.acquire(KEY, _holder(2), ttl=30).lease
    before = store.get(KEY)
    audit_before = len(store.history(KEY))

    with pytest.raises(LeaseLost):
        store.complete(old, {"charged": 1})
    with pytest.raises(LeaseLost):
        store.fail(old, "boom")
    with pytest.raises(LeaseLost):
        store.release(old)
    with pytest.raises(LeaseLost):
        store.renew(old)

    assert store.get(KEY) == before
    assert len(store.history(KEY)) == audit_before
    store.complete(new, {"charged": 2})
    row = store.get(KEY)
    assert row is not None
    assert row["result"] == {"charged": 2}


def test_a_complete_retried_after_a_lost_answer_is_not_an_error(store: LeaseStore) -> None:
    lease = store.acquire(KEY, _holder(1)).lease
    store.complete(lease, {"charged": 3})

    store.complete(lease, {"charged": 3})

    assert [r["event"] for r in store.history(KEY)].count("complete") == 1


def test_acquire_many_takes_each_key_once_in_one_call(store: LeaseStore, lease_db: str) -> None:
    keys = [str(lease_key("tenant_webhooks", "send", "2024-02-15", f"t{i:03d}")) for i in range(50)]
    store.complete(store.acquire(keys[0], _holder(1)).lease, {"sent": 1})
    store.acquire(keys[1], _holder(9), ttl=30)

    got = store.acquire_many([*keys, keys[2]], _holder(1))

    assert [a.key for a in got] == sorted(keys)
    by_key = {a.key: a for a in got}
    assert by_key[keys[0]].outcome is Outcome.SUCCEEDED
    assert by_key[keys[0]].result == {"sent": 1}
    assert by_key[keys[1]].outcome is Outcome.HELD
    granted = [a for a in got if a.granted]
    assert len(granted) == 48
    assert len({a.token for a in granted}) == 48
    with psycopg.connect(lease_db) as conn:
        running = conn.execute(
            "SELECT count(*) FROM runlease.lease WHERE state = 'running' AND key LIKE 'tenant%%'"
        ).fetchone()
    assert running == (49,)
