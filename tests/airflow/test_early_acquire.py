"""The acquire a protected try starts once its templates are rendered (``early_acquire``).

Each test renders the operator's templates as the task runner does (``render_template_fields``
with the try's context), then runs ``execute`` (or stops the try), against the real lease store
and sink, and asserts what a user sees: the charges, the lease's state and its audit trail.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.protection import connection_warmup, early_acquire
from airflow_plugins.protection.operators import ExactlyOnceOperator
from tests.airflow.conftest import task_context
from tests.airflow.test_operator import (
    CUSTOMERS,
    KEY,
    NIGHT,
    Billing,
    _charges,
    _lease,
    _operator,
)
from tests.lease.waiting import wait_for


@pytest.fixture
def preparing(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process is a task runner's, started to run billing_nightly.charge."""
    monkeypatch.setattr(connection_warmup, "_task", ("billing_nightly", "charge"))


def _events(lease: str) -> list[tuple[str, str | None]]:
    with LeaseStore(lease) as store:
        return [(h["event"], h["outcome"]) for h in store.history(KEY)]


def _rendered(lease: str, **kwargs: Any) -> tuple[Billing, ExactlyOnceOperator, dict[str, Any]]:
    """A try of the billing task whose templates the task runner rendered: its lease is taken."""
    body = Billing()
    op = _operator(body, **kwargs)
    context = task_context(op, logical_date=NIGHT)
    op.render_template_fields(context)
    with LeaseStore(lease) as store:
        assert wait_for(lambda: store.get(KEY), timeout=10)  # taken before execute
    return body, op, context


def test_rendering_starts_the_acquire_and_execute_uses_its_grant(
    plugin_env: dict[str, str], preparing: None
) -> None:
    body, op, context = _rendered(plugin_env["lease"])
    assert _lease(plugin_env["lease"])["state"] == "running"
    assert op.execute(context) == {"charged": 5}
    token = body.fences[0].token
    assert _charges(plugin_env["sink"]) == [(c, token) for c in CUSTOMERS]
    # one acquire for the try: execute took the early one's answer instead of asking again
    assert [e for e in _events(plugin_env["lease"]) if e[0] == "acquire"] == [
        ("acquire", "granted")
    ]
    assert _lease(plugin_env["lease"])["state"] == "succeeded"


def test_a_try_killed_before_execute_releases_the_early_grant(
    plugin_env: dict[str, str], preparing: None
) -> None:
    body, op, context = _rendered(plugin_env["lease"])
    op.on_kill()  # Airflow's SIGTERM before the work started
    row = _lease(plugin_env["lease"])
    assert row["state"] == "released"
    assert "on_kill" in row["error"]
    # the killed try does not start the work if Airflow still gets to execute
    with pytest.raises(AirflowException, match="stopped before its work started"):
        op.execute(context)
    assert body.calls == 0
    assert _lease(plugin_env["lease"])["token"] == row["token"]  # nothing acquired again
    # the next try is granted at once and does the work
    retry = _operator(body)
    assert retry.execute(task_context(retry, logical_date=NIGHT, try_number=2)) == {"charged": 5}
    assert body.calls == 1
    assert len(_charges(plugin_env["sink"])) == 5


def test_a_stale_early_grant_taken_over_meanwhile_is_not_used(
    plugin_env: dict[str, str], preparing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the try's process stopped between rendering and execute past its lease's TTL: another
    # holder took the key over; the old grant is renewed before use, found lost, and the try
    # asks again and waits for the new holder instead of running the body
    monkeypatch.setattr(early_acquire, "STALE_AFTER", 0.0)
    body, op, context = _rendered(plugin_env["lease"], lease_ttl=1)
    time.sleep(1.2)  # the early grant expires
    with LeaseStore(plugin_env["lease"]) as store:
        newer = store.acquire(KEY, Holder.process("the next try"), ttl=30)
    assert newer.granted
    with pytest.raises(TaskDeferred):
        op.execute(context)
    assert body.calls == 0
    assert _charges(plugin_env["sink"]) == []
    assert _lease(plugin_env["lease"])["token"] == newer.token


def test_outside_a_task_runner_rendering_takes_no_lease(plugin_env: dict[str, str]) -> None:
    # e.g. rendering a task's templates to look at them: only the process Airflow started to
    # run this task (its parse named the task) acquires early
    op = _operator(Billing())
    op.render_template_fields(task_context(op, logical_date=NIGHT))
    time.sleep(0.3)
    with LeaseStore(plugin_env["lease"]) as store:
        assert store.get(KEY) is None


def test_a_rerun_request_is_approved_before_its_acquire(
    plugin_env: dict[str, str], preparing: None
) -> None:
    # a sanctioned re-run of a succeeded date: the early acquire approves it first, as execute
    # would (else it would find the key succeeded and the work would be skipped)
    body = Billing()
    op = _operator(body)
    op.execute(task_context(op, logical_date=NIGHT))
    rerun = {"business_date": "2024-02-15", "exactly_once_rerun": {"reason": "INC-42 refund fix"}}
    with LeaseStore(plugin_env["lease"]) as store:  # as the page's approve action does
        store.approve_rerun(KEY, actor="alice", reason="INC-42 refund fix")
    context = task_context(op, run_id="manual__rerun", conf=rerun, triggering_user="alice")
    op.render_template_fields(context)
    assert wait_for(lambda: len(_events(plugin_env["lease"])) > 3)  # approved and granted early
    assert op.execute(context) == {"charged": 5}
    assert body.calls == 2
    assert len(_charges(plugin_env["sink"])) == 2 * len(CUSTOMERS)  # re-done, once
    events = [e for e in _events(plugin_env["lease"]) if e[0] in ("approve_rerun", "acquire")]
    assert events == [("acquire", "granted"), ("approve_rerun", "approved"), ("acquire", "granted")]
