"""Losing the lease on a dead network: declared lost in time, without a reconnect storm.

The old holder reaches the lease store through a proxy the test controls (127.0.0.1 only);
the new holder reaches it directly. Each test asserts the order of what happened or counts
what the proxy saw, never a duration.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from airflow_plugins.lease import Holder, LeaseKeeper, LeaseStore, LeaseStoreUnavailable
from airflow_plugins.lease.fence import Fence
from tests.lease.tcp_proxy import TcpProxy
from tests.lease.waiting import wait_for

KEY = "billing_nightly/charge/2024-02-15"
TTL = 3.0  # margin 0.6 s: room for a busy machine
# connection attempts the keeper may make through an outage of one TTL: a few per renew
# interval (today's keeper made hundreds in the last fraction of a second)
MOST_ATTEMPTS = 12


def test_a_black_holed_keeper_declares_the_lease_lost_before_another_is_granted(
    lease_db: str,
) -> None:
    events: list[str] = []
    lock = threading.Lock()

    def note(event: str) -> None:
        with lock:
            events.append(event)

    proxy, via_proxy = TcpProxy.to_dsn(lease_db)
    with (
        proxy,
        LeaseStore(lease_db) as direct,
        LeaseStore(via_proxy, connect_timeout=1.0, pool_size=1) as old_store,
    ):
        lease = old_store.acquire(KEY, Holder.process("old"), ttl=TTL).lease
        fence = Fence(
            key=lease.key,
            token=lease.token,
            attempt=lease.attempt,
            business_date="2024-02-15",
            lease=lease,
        )

        def on_lost(reason: str) -> None:
            fence.stop(f"lease lost: {reason}")  # what a protected try's keeper does
            note("old keeper: lost")

        keeper = LeaseKeeper(old_store, lease, interval=TTL / 4, on_lost=on_lost).start()
        try:
            wait_for(lambda: keeper.renewals >= 2, timeout=30)
            proxy.blackhole()  # the old holder's packets vanish from now on

            def taken_over() -> bool:
                got = direct.acquire(KEY, Holder.process("new"), ttl=30)
                if got.granted:
                    note(f"new holder: granted, old fence stopped={fence.stopped}")
                return got.granted

            wait_for(taken_over, timeout=30, every=0.02)
            wait_for(lambda: keeper.lost, timeout=10)
        finally:
            proxy.close()  # a keeper still stuck on the proxy gets an error now
            keeper.stop()
    assert events == ["old keeper: lost", "new holder: granted, old fence stopped=True"]
    assert "could not renew" in (keeper.lost_reason or "")


def test_an_outage_costs_a_few_reconnects_not_a_storm(lease_db: str) -> None:
    proxy, via_proxy = TcpProxy.to_dsn(lease_db)
    with proxy, LeaseStore(via_proxy, connect_timeout=1.0, pool_size=1) as store:
        lease = store.acquire(KEY, Holder.process("h"), ttl=TTL).lease
        keeper = LeaseKeeper(store, lease, interval=TTL / 4).start()
        try:
            wait_for(lambda: keeper.renewals >= 1, timeout=30)
            before = proxy.accepted
            proxy.refuse()  # the store is down: every connection attempt is closed at once
            wait_for(lambda: keeper.lost, timeout=30)
        finally:
            keeper.stop()
        attempts = proxy.accepted - before
    assert 1 <= attempts <= MOST_ATTEMPTS, f"{attempts} connection attempts in one outage"


def test_sink_connections_are_bounded_in_time(
    sink_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_plugins.protection import protected_try
    from bridge.worker import activity_fence

    p = psycopg.conninfo.conninfo_to_dict(sink_db)
    uri = f"postgres://{p.get('user', 'postgres')}@{p['host']}:{p.get('port', 5432)}/{p['dbname']}"
    monkeypatch.setenv("AIRFLOW_CONN_BILLING_SINK", uri)
    connect = protected_try._sink_connect("billing_sink")
    assert connect is not None
    for make in (connect, activity_fence._connector(sink_db)):
        with make() as conn:
            params = conn.info.get_parameters()
            assert params.get("keepalives") == "1"
            assert int(params.get("tcp_user_timeout", "0")) > 0
            assert int(params.get("connect_timeout", "0")) > 0
            assert isinstance(conn, psycopg.Connection)


def test_a_store_call_on_a_black_holed_connection_fails_closed_in_its_bound(
    lease_db: str,
) -> None:
    proxy, via_proxy = TcpProxy.to_dsn(lease_db)
    with proxy, LeaseStore(via_proxy, connect_timeout=1.0, call_timeout=1.0) as store:
        assert store.acquire(KEY, Holder.process("a")).granted  # the kept connection is open
        proxy.blackhole()
        with pytest.raises(LeaseStoreUnavailable, match="no answer within 1 s"):
            store.get(KEY)
        with pytest.raises(LeaseStoreUnavailable):
            store.acquire(KEY, Holder.process("b"))  # a new connection: connect_timeout
        proxy.forward()
        row = store.get(KEY)  # the ended connection was not reused
    assert row is not None
    assert row["state"] == "running"
