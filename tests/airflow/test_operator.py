"""ExactlyOnceOperator outcomes against the real lease store and a real sink database.

Each test runs the operator's ``execute`` as the task runner would (see conftest for the
context), and asserts what a user would see: rows in the sink, the lease's state and result,
the audit trail, and what the task does (returns, defers, fails).
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pendulum
import psycopg
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from airflow_plugins.lease import Holder, LeaseStore, Outcome, StaleToken, fenced_transaction
from airflow_plugins.lease.fence import Fence, FenceStopped
from airflow_plugins.protection import routing
from airflow_plugins.protection.operators import ExactlyOnceOperator
from airflow_plugins.protection.triggers import LeaseReleasedTrigger, LeaseStoreReachableTrigger
from tests.airflow.conftest import closed_port, task_context

KEY = "billing_nightly/charge/2024-02-15"
NIGHT = datetime(2024, 2, 15, 2, tzinfo=UTC)
CUSTOMERS = [f"cust-{i:03d}" for i in range(1, 6)]


class Billing:
    """The body under test: charges customers through the fence; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.fences: list[Fence] = []

    def __call__(self, fence: Fence, customers: list[str]) -> dict[str, Any]:
        self.calls += 1
        self.fences.append(fence)
        charged = 0
        with fence.transaction() as tx:
            for customer in tx.claim_many(customers):
                tx.conn.execute(
                    "INSERT INTO charges (run_key, customer, token, writer) "
                    "VALUES (%s, %s, %s, %s)",
                    (fence.key, customer, fence.token, "operator"),
                )
                charged += 1
        return {"charged": charged}


def _operator(body: Any, **kwargs: Any) -> ExactlyOnceOperator:
    with DAG(
        "billing_nightly",
        schedule="0 2 * * *",
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    ):
        return ExactlyOnceOperator(
            task_id="charge",
            python_callable=body,
            sink_conn_id="sink",
            op_kwargs={"customers": CUSTOMERS},
            **kwargs,
        )


def _charges(sink: str) -> list[tuple[str, int]]:
    with psycopg.connect(sink) as conn:
        return conn.execute("SELECT customer, token FROM charges ORDER BY customer").fetchall()


def _lease(lease: str) -> dict[str, Any]:
    with LeaseStore(lease) as store:
        row = store.get(KEY)
    assert row is not None
    return row


def test_granted_runs_once_and_records_the_result(plugin_env: dict[str, str]) -> None:
    body = Billing()
    op = _operator(body)
    result = op.execute(task_context(op, logical_date=NIGHT))
    assert result == {"charged": 5}
    assert body.calls == 1
    token = body.fences[0].token
    assert _charges(plugin_env["sink"]) == [(c, token) for c in CUSTOMERS]
    row = _lease(plugin_env["lease"])
    assert (row["state"], row["token"], row["result"]) == ("succeeded", token, {"charged": 5})
    assert op.retries == 4
    assert op.retry_exponential_backoff == 2.0


def test_already_succeeded_does_not_run_and_returns_the_recorded_result(
    plugin_env: dict[str, str],
) -> None:
    body = Billing()
    op = _operator(body)
    first = op.execute(task_context(op, logical_date=NIGHT))
    # a second DAG run of the same business date (triggered by hand), then a cleared task
    again = op.execute(task_context(op, run_id="manual__x", conf={"business_date": "2024-02-15"}))
    cleared = op.execute(task_context(op, logical_date=NIGHT, try_number=2))
    assert first == again == cleared == {"charged": 5}
    assert body.calls == 1
    assert len(_charges(plugin_env["sink"])) == 5
    with LeaseStore(plugin_env["lease"]) as store:
        outcomes = [r["outcome"] for r in store.history(KEY) if r["event"] == "acquire"]
    assert outcomes == ["granted", "succeeded", "succeeded"]


def test_held_defers_on_the_trigger_then_runs_after_release(plugin_env: dict[str, str]) -> None:
    body = Billing()
    op = _operator(body)
    context = task_context(op, logical_date=NIGHT)
    with LeaseStore(plugin_env["lease"]) as store:
        other = store.acquire(KEY, Holder.process("first run"), ttl=30).lease
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(context)
        assert body.calls == 0
        trigger = deferred.value.trigger
        assert isinstance(trigger, LeaseReleasedTrigger)
        assert deferred.value.method_name == "resume_after_wait"
        classpath, kwargs = trigger.serialize()
        assert classpath == "airflow_plugins.protection.triggers.LeaseReleasedTrigger"
        assert kwargs["key"] == KEY
        assert kwargs["token"] == other.token
        assert kwargs["dsn"] is None

        async def wait() -> Any:
            gen = trigger.run()
            task = asyncio.ensure_future(gen.__anext__())
            await asyncio.sleep(0.6)
            assert not task.done()  # still held: no event
            await asyncio.to_thread(store.release, other, "first run stopped")
            return await asyncio.wait_for(task, 20)

        event = asyncio.run(wait())
        assert event.payload["state"] == "released"
    result = op.resume_after_wait(context, event=event.payload)
    assert result == {"charged": 5}
    assert body.calls == 1
    assert body.fences[0].token > other.token


def test_a_failed_body_fails_the_lease_and_the_retry_gets_a_new_token(
    plugin_env: dict[str, str],
) -> None:
    calls: list[int] = []

    def flaky(fence: Fence, customers: list[str]) -> dict[str, Any]:
        calls.append(fence.token)
        if len(calls) == 1:
            with fence.transaction() as tx:
                tx.claim_many(customers[:2])
                for c in customers[:2]:
                    tx.conn.execute(
                        "INSERT INTO charges (run_key, customer, token) VALUES (%s, %s, %s)",
                        (fence.key, c, fence.token),
                    )
            raise RuntimeError("payment gateway timeout")
        return Billing()(fence, customers)

    op = _operator(flaky)
    with pytest.raises(RuntimeError, match="gateway timeout"):
        op.execute(task_context(op, logical_date=NIGHT, try_number=1))
    row = _lease(plugin_env["lease"])
    assert row["state"] == "failed"
    assert "payment gateway timeout" in row["error"]
    assert op.execute(task_context(op, logical_date=NIGHT, try_number=2)) == {"charged": 3}
    assert calls[1] > calls[0]
    # every customer once: the retry skipped the two the first try had charged
    assert sorted(c for c, _ in _charges(plugin_env["sink"])) == CUSTOMERS
    # the first try's token is refused at the sink now
    with psycopg.connect(plugin_env["sink"], autocommit=True) as conn, pytest.raises(StaleToken):
        with fenced_transaction(conn, KEY, calls[0]):
            pass


def test_an_expired_holder_is_taken_over_and_its_late_writes_refused(
    plugin_env: dict[str, str],
) -> None:
    body = Billing()
    op = _operator(body)
    with LeaseStore(plugin_env["lease"]) as store:
        stale = store.acquire(KEY, Holder.process("dead scheduler's try"), ttl=0.5).lease
    deadline = time.monotonic() + 20
    while True:
        try:
            result = op.execute(task_context(op, logical_date=NIGHT))
            break
        except TaskDeferred:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert result == {"charged": 5}
    with LeaseStore(plugin_env["lease"]) as store:
        outcomes = [r["outcome"] for r in store.history(KEY) if r["event"] == "acquire"]
    assert outcomes[-1] == "taken_over"
    # the old holder wakes up and tries to write: refused at the sink
    with psycopg.connect(plugin_env["sink"], autocommit=True) as conn, pytest.raises(StaleToken):
        with fenced_transaction(conn, KEY, stale.token) as tx:
            tx.conn.execute(
                "INSERT INTO charges (run_key, customer) VALUES (%s, 'cust-001')", (KEY,)
            )
    assert len(_charges(plugin_env["sink"])) == 5


def test_unreachable_store_defers_and_never_runs_the_body(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW__EXACTLY_ONCE__LEASE_DSN",
        f"host=127.0.0.1 port={closed_port()} user=postgres dbname=x connect_timeout=1",
    )
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__WAIT_AT_LEAST", "12")
    body = Billing()
    op = _operator(body)
    deferred_at = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context(op, logical_date=NIGHT))
    assert isinstance(deferred.value.trigger, LeaseStoreReachableTrigger)
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "airflow_plugins.protection.triggers.LeaseStoreReachableTrigger"
    # it resumes no sooner than [exactly_once] wait_at_least after deferring
    assert deferred_at + 12 <= kwargs["not_before"] <= time.time() + 12
    assert body.calls == 0
    assert _charges(plugin_env["sink"]) == []


def test_no_lease_store_configured_fails_retryably_without_running(
    sink_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__LEASE_CONN_ID", "nowhere")
    body = Billing()
    op = _operator(body)
    with pytest.raises(AirflowException, match="lease store is not configured") as failed:
        op.execute(task_context(op, logical_date=NIGHT))
    assert not isinstance(failed.value, AirflowFailException)  # Airflow's retries apply
    assert body.calls == 0


def test_a_manual_run_without_a_date_fails_without_retrying(plugin_env: dict[str, str]) -> None:
    body = Billing()
    op = _operator(body)
    with pytest.raises(AirflowFailException, match="business_date"):
        op.execute(task_context(op, run_id="manual__1", logical_date=None))
    assert body.calls == 0


def test_on_kill_stops_the_body_promptly_and_releases_the_lease(
    plugin_env: dict[str, str],
) -> None:
    started = threading.Event()
    stopped_after: list[float] = []

    def endless(fence: Fence, customers: list[str]) -> None:
        started.set()
        while True:
            try:
                fence.check()
            except FenceStopped:
                stopped_after.append(time.monotonic())
                raise
            time.sleep(0.01)

    op = _operator(endless)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            op.execute(task_context(op, logical_date=NIGHT))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(20)
    killed_at = time.monotonic()
    op.on_kill()
    worker.join(20)
    assert not worker.is_alive()
    assert isinstance(errors[0], FenceStopped)
    assert stopped_after[0] - killed_at < 1.0
    row = _lease(plugin_env["lease"])
    assert row["state"] == "released"
    assert "on_kill" in row["error"]


def test_a_sanctioned_rerun_runs_once_more_audited_with_the_user(
    plugin_env: dict[str, str],
) -> None:
    body = Billing()
    op = _operator(body)
    op.execute(task_context(op, logical_date=NIGHT))
    rerun = {"business_date": "2024-02-15", "exactly_once_rerun": {"reason": "INC-42 refund fix"}}
    with LeaseStore(plugin_env["lease"]) as store:  # as the page's approve action does
        store.approve_rerun(KEY, actor="alice", reason="INC-42 refund fix")
    context = task_context(op, run_id="manual__rerun", conf=rerun, triggering_user="alice")
    assert op.execute(context) == {"charged": 5}
    assert body.calls == 2
    # the re-run re-did every charge, once, without anyone touching the sink's ledger
    assert sorted(c for c, _ in _charges(plugin_env["sink"])) == sorted(CUSTOMERS * 2)
    # a retry or clear inside the same re-run does not approve again
    again = task_context(
        op, run_id="manual__rerun", conf=rerun, triggering_user="alice", try_number=2
    )
    assert op.execute(again) == {"charged": 5}
    assert body.calls == 2
    with LeaseStore(plugin_env["lease"]) as store:
        approvals = [r for r in store.history(KEY) if r["event"] == "approve_rerun"]
    assert len(approvals) == 1
    assert approvals[0]["actor"] == "alice"
    assert "INC-42" in approvals[0]["reason"]
    # without a user or a reason it is refused, and nothing runs
    for bad_conf, user in ((rerun, None), ({**rerun, "exactly_once_rerun": {}}, "bob")):
        ctx = task_context(op, run_id="manual__bad", conf=bad_conf, triggering_user=user)
        with pytest.raises(AirflowFailException, match="exactly_once_rerun"):
            op.execute(ctx)
    assert body.calls == 2


def test_disabled_plugin_runs_the_body_plainly_every_time(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__ENABLED", "False")
    body = Billing()
    op = _operator(body)
    op.execute(task_context(op, logical_date=NIGHT))
    op.execute(task_context(op, run_id="manual__2", conf={"business_date": "2024-02-15"}))
    assert body.calls == 2
    assert not body.fences[0].protected
    assert len(_charges(plugin_env["sink"])) == 10  # what plain Airflow does: charged twice
    with LeaseStore(plugin_env["lease"]) as store:
        assert store.get(KEY) is None


def test_the_router_can_hand_the_work_over(plugin_env: dict[str, str]) -> None:
    seen: list[routing.ProtectedRun] = []

    class Elsewhere:
        def start(self, operator: Any, context: Any, run: routing.ProtectedRun) -> Any:
            seen.append(run)
            return {"ran": "elsewhere"}

        def resume(self, operator: Any, context: Any, run: Any, event: Any) -> Any:
            return {"resumed": event}

    class ToTemporal:
        def route(self, run: routing.ProtectedRun) -> routing.Route:
            return routing.Route(mode="temporal", handover=Elsewhere())

    routing.register_router(ToTemporal())
    body = Billing()
    op = _operator(body)
    context = task_context(op, logical_date=NIGHT)
    assert op.execute(context) == {"ran": "elsewhere"}
    assert op.resume_handover(context, event={"done": 1}) == {"resumed": {"done": 1}}
    assert body.calls == 0
    assert str(seen[0].key) == KEY
    assert seen[0].run_id == context["ti"].run_id
    with LeaseStore(plugin_env["lease"]) as store:
        assert store.get(KEY) is None  # the engine it went to takes the lease itself


def test_an_unrecordable_result_fails_the_task_and_the_lease(plugin_env: dict[str, str]) -> None:
    op = _operator(lambda fence, customers: object())
    with pytest.raises(AirflowFailException, match="cannot be recorded"):
        op.execute(task_context(op, logical_date=NIGHT))
    assert _lease(plugin_env["lease"])["state"] == "failed"


def test_a_date_beyond_the_retention_horizon_is_refused_without_retrying(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__HORIZON_DAYS", "400")
    body = Billing()
    op = _operator(body)
    with pytest.raises(AirflowFailException, match="retention horizon"):
        op.execute(task_context(op, logical_date=datetime(2020, 2, 15, 2, tzinfo=UTC)))
    assert body.calls == 0


def test_acquire_outcome_names_match_the_store() -> None:
    # the operator's branches are exactly the store's outcomes
    assert {o.value for o in Outcome} == {"granted", "taken_over", "held", "succeeded", "refused"}
