"""A bridge activity told to stop (cancelled, worker shutting down) never completes its lease,
whatever its code returns (issue 16, item 2); a cancelled attempt whose code never checks its
fence gives its lease up, so a retry takes over, and so does an attempt Temporal gave up without
the SDK cancelling it: cut off from the server, or retried elsewhere (issue 16, item 15).

Runs ``bridge.run_task`` in temporalio's ``ActivityEnvironment`` (Temporal's delivery of a
cancellation or a worker shutdown is the boundary here, not what is tested), on the real lease
store and sink: the assertions are the lease's state and the charges in the sink.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.fence import Fence
from bridge.cutover import ModeStore
from bridge.identity import task_lease_key
from bridge.spec import RunMode, TaskInput, TaskSpec
from bridge.worker.activities import BridgeActivities
from bridge.worker.attempt_watch import Attempt
from bridge.worker.catalog import TaskCatalog
from tests.airflow.conftest import conn_uri

DAG_ID = "billing_bridge_stop"
DATE = "2024-02-15"
CUSTOMERS = [f"cust-{i}" for i in range(6)]


def _charges(sink: str) -> list[str]:
    with psycopg.connect(sink) as conn:
        rows = conn.execute("SELECT customer FROM charges ORDER BY customer").fetchall()
    return [r[0] for r in rows]


def _billing(before_third: Callable[[Fence], None]) -> Callable[[Fence], dict[str, int]]:
    """A billing body that isolates each customer's errors (so a stop or a refusal is swallowed
    too) and calls ``before_third`` before the third customer."""

    def billing(fence: Fence) -> dict[str, int]:
        charged = 0
        for n, customer in enumerate(CUSTOMERS):
            if n == 2:
                before_third(fence)
            try:
                with fence.transaction() as tx:
                    if tx.claim(customer):
                        tx.conn.execute(
                            "INSERT INTO charges (run_key, customer, token) VALUES (%s, %s, %s)",
                            (fence.key, customer, fence.token),
                        )
                        charged += 1
            except Exception:
                continue
        return {"charged": charged}

    return billing


@pytest.mark.parametrize("stop", ["cancel", "worker_shutdown"])
def test_a_stopped_activity_whose_code_swallows_the_stop_is_not_completed(
    stop: str, lease_db: str, sink_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SINK", conn_uri(sink_db))
    env = ActivityEnvironment()
    charged_two = threading.Event()

    def stopped(fence: Fence) -> None:
        charged_two.set()
        assert fence.stop_event.wait(20)  # the heartbeat thread sees the stop

    billing = _billing(stopped)

    catalog = TaskCatalog()
    catalog.register(DAG_ID, "charge", billing)
    spec = TaskSpec(task_id="charge", fenced=True, sink="sink", heartbeat_s=0.6, lease_ttl_s=5)
    inp = TaskInput(dag_id=DAG_ID, business_date=DATE, task=spec, mode=RunMode.PRIMARY)
    errors: list[BaseException] = []
    with LeaseStore(lease_db, horizon_days=4000) as store:
        activities = BridgeActivities(store, catalog, ModeStore(store))

        def run() -> None:
            try:
                env.run(activities.run_task, inp)
            except BaseException as exc:
                errors.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        assert charged_two.wait(20)
        signal: Callable[[], Any] = env.cancel if stop == "cancel" else env.worker_shutdown
        signal()
        worker.join(30)
        assert not worker.is_alive()
        row = store.get(str(task_lease_key(DAG_ID, "charge", DATE, None, RunMode.PRIMARY)))
    assert row is not None
    # released, not completed: the next attempt finishes the work from the ledger
    assert row["state"] == "released"
    assert row["result"] is None
    assert errors
    assert isinstance(errors[0], ApplicationError)
    # a cancellation may reach the code first as the SDK's CancelledError: failed all the same
    assert errors[0].type in (
        {"FenceStopped", "CancelledError"} if stop == "cancel" else {"FenceStopped"}
    )
    assert _charges(sink_db) == CUSTOMERS[:2]


def test_an_activity_whose_store_blips_at_completion_records_it_and_is_not_run_again(
    lease_db: str, sink_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.airflow.test_recording_outcome import StoreOutage

    monkeypatch.setenv("AIRFLOW_CONN_SINK", conn_uri(sink_db))
    outage = StoreOutage(lease_db)
    calls: list[int] = []

    def billing(fence: Fence) -> dict[str, int]:
        calls.append(fence.token)
        with fence.transaction() as tx:
            for customer in tx.claim_many(CUSTOMERS):
                tx.conn.execute(
                    "INSERT INTO charges (run_key, customer, token) VALUES (%s, %s, %s)",
                    (fence.key, customer, fence.token),
                )
        outage.begin(seconds=2.0)
        return {"charged": len(CUSTOMERS)}

    catalog = TaskCatalog()
    catalog.register(DAG_ID, "charge", billing)
    spec = TaskSpec(task_id="charge", fenced=True, sink="sink", heartbeat_s=0.6, lease_ttl_s=5)
    inp = TaskInput(dag_id=DAG_ID, business_date=DATE, task=spec, mode=RunMode.PRIMARY)
    with LeaseStore(lease_db, horizon_days=4000) as store:
        activities = BridgeActivities(store, catalog, ModeStore(store))
        try:
            first = ActivityEnvironment().run(activities.run_task, inp)
        finally:
            outage.end()
        again = ActivityEnvironment().run(activities.run_task, inp)
        row = store.get(str(task_lease_key(DAG_ID, "charge", DATE, None, RunMode.PRIMARY)))
    assert (first.status, first.result) == ("succeeded", {"charged": 6})
    assert (again.status, again.result) == ("recorded", {"charged": 6})
    assert row is not None
    assert row["state"] == "succeeded"
    assert len(calls) == 1
    assert _charges(sink_db) == CUSTOMERS


class _Watch:
    """What Temporal answers the heartbeat thread (the server is the boundary here)."""

    def __init__(self, answer: Attempt) -> None:
        self.answer = answer
        self.asked = 0

    def ask(self, info: Any) -> Attempt:
        self.asked += 1
        return self.answer


@pytest.mark.parametrize(
    "given_up",
    ["cancelled", "cut_off_from_temporal", "retried_elsewhere"],
)
def test_an_attempt_temporal_gave_up_that_never_checks_its_fence_lets_a_retry_take_over(
    given_up: str, lease_db: str, sink_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporal gave attempt 1 up, but its code is stuck and never calls ``fence.check()``:
    without the abandon, attempt 1's keeper renews on and every retry is answered ``held``.
    Only ``cancelled`` reaches the code through the SDK; the other two are what the heartbeat
    thread learns by asking the server (or failing to)."""
    monkeypatch.setenv("AIRFLOW_CONN_SINK", conn_uri(sink_db))
    stuck, release_stuck = threading.Event(), threading.Event()

    def stuck_in_attempt_one(fence: Fence) -> None:
        if fence.attempt == 1:
            stuck.set()
            release_stuck.wait(60)  # stuck in a call that never looks at the fence

    billing = _billing(stuck_in_attempt_one)

    catalog = TaskCatalog()
    catalog.register(DAG_ID, "charge", billing)
    spec = TaskSpec(task_id="charge", fenced=True, sink="sink", heartbeat_s=0.6, lease_ttl_s=3)
    inp = TaskInput(dag_id=DAG_ID, business_date=DATE, task=spec, mode=RunMode.PRIMARY)
    first, retry = ActivityEnvironment(), ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    outcomes: list[Any] = []
    answers = {"cut_off_from_temporal": Attempt.UNKNOWN, "retried_elsewhere": Attempt.GIVEN_UP}
    watch = _Watch(answers.get(given_up, Attempt.WANTED))
    with LeaseStore(lease_db, horizon_days=4000) as store:
        old = BridgeActivities(store, catalog, ModeStore(store), watch)
        activities = BridgeActivities(store, catalog, ModeStore(store), _Watch(Attempt.WANTED))

        def run_first() -> None:
            try:
                outcomes.append(first.run(old.run_task, inp))
            except BaseException as exc:
                outcomes.append(exc)

        worker = threading.Thread(target=run_first)
        worker.start()
        try:
            assert stuck.wait(20)
            if given_up == "cancelled":
                first.cancel()
            statuses = []
            for _ in range(40):  # the TTL is 3 s: the retry must get the key within it, or so
                got = retry.run(activities.run_task, inp)
                statuses.append(got.status)
                if got.status != "held":
                    break
                time.sleep(0.5)
            assert statuses[-1] == "succeeded", statuses
            assert worker.is_alive()  # attempt 1 is still stuck while the retry finished
        finally:
            release_stuck.set()
            worker.join(30)
        row = store.get(str(task_lease_key(DAG_ID, "charge", DATE, None, RunMode.PRIMARY)))
    assert row is not None
    assert row["state"] == "succeeded"
    # attempt 1's late writes were refused: each customer charged once
    assert sorted(_charges(sink_db)) == sorted(CUSTOMERS)
