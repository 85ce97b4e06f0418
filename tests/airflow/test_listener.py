"""The listener's hooks, called as Airflow calls them, against the real lease store.

That the scheduler and the task runner do call them (and survive them) is shown end to end on
the harness; here: exact hookspec signatures, the audit rows, the duplicate-run flag, failing a
failed try's lease on its behalf, idempotence, and never raising.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import subprocess
import sys
import threading
import time
from datetime import UTC, date, datetime
from types import SimpleNamespace
from typing import Any

import pendulum
import psutil
import psycopg
import pytest
from airflow._shared.listeners.spec import lifecycle as lifecycle_spec
from airflow.listeners.spec import dagrun as dagrun_spec
from airflow.sdk import DAG
from airflow.sdk._shared.listeners.spec import taskinstance as ti_spec

from airflow_plugins.lease import Holder, LeaseKeeper, LeaseStore, Outcome
from airflow_plugins.protection import listener
from tests.airflow.conftest import closed_port
from tests.lease.waiting import wait_for

RUN_KEY = "billing_nightly/_dag_run/2024-02-15"


@pytest.fixture(autouse=True)
def _fresh_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listener, "_paused_until", 0.0)
    monkeypatch.setattr(listener, "_seen", set())


def _dag(tags: list[str]) -> DAG:
    with DAG(
        "billing_nightly",
        schedule="0 2 * * *",
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        tags=tags,
    ) as dag:
        pass
    return dag


def _dag_run(run_id: str, dag: DAG, **fields: Any) -> SimpleNamespace:
    values: dict[str, Any] = {
        "dag_id": dag.dag_id,
        "run_id": run_id,
        "dag": dag,
        "conf": {},
        "logical_date": datetime(2024, 2, 15, 2, tzinfo=UTC),
        "run_type": "scheduled",
        "triggering_user_name": None,
    }
    values.update(fields)
    return SimpleNamespace(**values)


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        (dagrun_spec, ("on_dag_run_running", "on_dag_run_success", "on_dag_run_failed")),
        (
            ti_spec,
            ("on_task_instance_failed", "on_task_instance_skipped"),
        ),
        (lifecycle_spec, ("on_starting",)),
    ],
)
def test_hooks_have_the_exact_hookspec_signatures(spec: Any, names: tuple[str, ...]) -> None:
    for name in names:
        ours = list(inspect.signature(getattr(listener, name)).parameters)
        theirs = list(inspect.signature(getattr(spec, name)).parameters)
        assert ours == theirs, name


def test_dag_runs_are_audited_and_a_second_run_of_a_date_is_flagged(
    plugin_env: dict[str, str],
) -> None:
    dag = _dag(["exactly-once"])
    first = _dag_run("scheduled__2024-02-15", dag)
    second = _dag_run(
        "manual__again",
        dag,
        logical_date=None,
        conf={"business_date": "2024-02-15"},
        run_type="manual",
        triggering_user_name="bob",
    )
    listener.on_dag_run_running(dag_run=first, msg="started")
    listener.on_dag_run_running(dag_run=first, msg="started")  # hooks can fire twice
    listener.on_dag_run_running(dag_run=second, msg="started")
    listener.on_dag_run_running(dag_run=second, msg="started")
    listener.on_dag_run_success(dag_run=first, msg="success")
    with LeaseStore(plugin_env["lease"]) as store:
        rows = store.history(RUN_KEY)
        by_date = store.audit_by_date(date(2024, 2, 15), outcome="flagged")
    events = [(r["event"], r["holder"]["run_id"]) for r in rows]
    assert events == [
        ("dag_run_running", "scheduled__2024-02-15"),
        ("dag_run_running", "manual__again"),
        ("duplicate_run", "manual__again"),
        ("dag_run_success", "scheduled__2024-02-15"),
    ]
    flagged = rows[2]
    assert flagged["outcome"] == "flagged"
    assert flagged["actor"] == "bob"
    assert "scheduled__2024-02-15 (running)" in flagged["reason"]
    assert [r["event"] for r in by_date] == ["duplicate_run"]


def test_runs_starting_together_are_recorded_once_each_and_flagged_once(
    plugin_env: dict[str, str],
) -> None:
    # two schedulers fire the hooks of two runs of one date at the same moment, twice each
    dag = _dag(["exactly-once"])
    days = [date(2024, 3, d) for d in range(1, 11)]
    for day in days:
        runs = [
            _dag_run(f"{name}__{day}", dag, logical_date=None, conf={"business_date": str(day)})
            for name in ("scheduled", "manual")
        ]
        barrier = threading.Barrier(8)

        def fire(run: SimpleNamespace, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            listener.on_dag_run_running(dag_run=run, msg="started")

        threads = [threading.Thread(target=fire, args=(runs[i % 2],)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    with LeaseStore(plugin_env["lease"]) as store:
        for day in days:
            events = sorted(
                (r["event"], r["holder"]["run_id"])
                for r in store.history(f"billing_nightly/_dag_run/{day}")
            )
            flagged = [run for event, run in events if event == "duplicate_run"]
            assert [e for e in events if e[0] == "dag_run_running"] == [
                ("dag_run_running", f"manual__{day}"),
                ("dag_run_running", f"scheduled__{day}"),
            ]
            assert len(flagged) == 1  # whichever started second


def test_a_run_after_a_succeeded_run_is_flagged_but_not_after_a_failed_one(
    plugin_env: dict[str, str],
) -> None:
    dag = _dag(["exactly-once"])
    failed = _dag_run("r1", dag)
    listener.on_dag_run_running(dag_run=failed, msg="")
    listener.on_dag_run_failed(dag_run=failed, msg="")
    retry_run = _dag_run("r2", dag)
    listener.on_dag_run_running(dag_run=retry_run, msg="")
    listener.on_dag_run_success(dag_run=retry_run, msg="")
    late = _dag_run("r3", dag)
    listener.on_dag_run_running(dag_run=late, msg="")
    with LeaseStore(plugin_env["lease"]) as store:
        flagged = [r for r in store.history(RUN_KEY) if r["event"] == "duplicate_run"]
    assert [r["holder"]["run_id"] for r in flagged] == ["r3"]
    assert "r2 (success)" in flagged[0]["reason"]


def test_two_partitions_of_one_date_are_two_runs_and_a_second_run_of_one_is_flagged(
    plugin_env: dict[str, str],
) -> None:
    dag = _dag(["exactly-once"])
    us = _dag_run("manual__us", dag, partition_key="us")
    eu = _dag_run("manual__eu", dag, partition_key="eu")
    us_again = _dag_run("manual__us_again", dag, partition_key="us")
    for run in (us, eu, us_again):
        listener.on_dag_run_running(dag_run=run, msg="started")
    with LeaseStore(plugin_env["lease"]) as store:
        by_key = {
            region: [
                (r["event"], r["holder"]["run_id"]) for r in store.history(f"{RUN_KEY}@{region}")
            ]
            for region in ("us", "eu")
        }
        plain = store.history(RUN_KEY)
    assert by_key == {
        "us": [
            ("dag_run_running", "manual__us"),
            ("dag_run_running", "manual__us_again"),
            ("duplicate_run", "manual__us_again"),
        ],
        "eu": [("dag_run_running", "manual__eu")],  # not a duplicate of us
    }
    assert plain == []


def test_unprotected_dags_are_not_audited(plugin_env: dict[str, str]) -> None:
    dag = _dag(["billing"])
    listener.on_dag_run_running(dag_run=_dag_run("r1", dag), msg="")
    with LeaseStore(plugin_env["lease"]) as store:
        assert store.history(RUN_KEY) == []


def test_hooks_never_raise_and_pause_while_the_store_is_down(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW__EXACTLY_ONCE__LEASE_DSN",
        f"host=127.0.0.1 port={closed_port()} user=postgres dbname=x connect_timeout=1",
    )
    dag = _dag(["exactly-once"])
    assert listener.on_dag_run_running(dag_run=_dag_run("r1", dag), msg="") is None
    assert listener._paused_until > 0  # the next hooks skip the store for a while
    # malformed input never escapes either
    broken = _dag_run("r2", dag, conf={"business_date": "not a date"})
    monkeypatch.setattr(listener, "_paused_until", 0.0)
    assert listener.on_dag_run_running(dag_run=broken, msg="") is None
    assert (
        listener.on_task_instance_failed(previous_state=None, task_instance=object(), error="x")
        is None
    )


class _Job:
    """Stands for ``airflow.jobs.job.Job``, which calls ``on_starting`` from its constructor."""

    job_type: str | None = None


_Job.__module__ = "airflow.jobs.job"


def _store_sockets() -> int:
    return sum(1 for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr[1] == 5432)


def test_a_starting_job_warms_the_store_and_leaves_nothing_open_across_a_fork(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    warmed: list[str] = []
    real_warm_up = LeaseStore.warm_up

    def warm_up(store: LeaseStore) -> bool:
        ran = real_warm_up(store)
        with store.connection() as conn:  # the warm-up's connection, open and answering
            row = conn.execute("SELECT current_database() AS db").fetchone()
            warmed.append(row["db"] if row else "")
        return ran

    monkeypatch.setattr(LeaseStore, "warm_up", warm_up)
    sockets, threads = _store_sockets(), threading.active_count()

    caplog.set_level(logging.INFO, logger=listener.__name__)
    job = _Job()
    job.job_type = "SchedulerJob"
    assert listener.on_starting(component=job) is None

    assert warmed == [psycopg.conninfo.conninfo_to_dict(plugin_env["lease"])["dbname"]]
    assert "lease store warmed as an Airflow job starts (SchedulerJob)" in caplog.text
    # closed before returning: an executor forked next inherits no connection, no thread
    assert _store_sockets() == sockets
    assert threading.active_count() == threads


def test_a_task_process_start_does_not_connect(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[object] = []
    monkeypatch.setattr(LeaseStore, "warm_up", lambda store: called.append(store))
    # the task runner's own marker (its process warms through
    # airflow_plugins.protection.connection_warmup)
    assert listener.on_starting(component=SimpleNamespace()) is None
    assert called == []


def test_a_starting_job_with_the_store_down_only_logs(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(
        "AIRFLOW__EXACTLY_ONCE__LEASE_DSN",
        f"host=127.0.0.1 port={closed_port()} user=postgres dbname=x",
    )
    sockets = _store_sockets()
    started = time.monotonic()
    assert listener.on_starting(component=_Job()) is None
    assert time.monotonic() - started < 2 * listener.CONNECT_TIMEOUT + 1
    assert _store_sockets() == sockets
    assert "lease store not reachable as an Airflow job starts" in caplog.text


def _failed_ti(run_id: str, try_number: int) -> SimpleNamespace:
    """A try as the API server reports it when a user marks it failed."""
    return SimpleNamespace(
        dag_id="billing_nightly",
        task_id="charge",
        run_id=run_id,
        map_index=-1,
        try_number=try_number,
    )


def test_a_failed_try_has_its_running_lease_failed_on_its_behalf(
    plugin_env: dict[str, str],
) -> None:
    key = "billing_nightly/charge/2024-02-15"
    # the try ran on this host and its process is gone: shown dead, failed at once
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with LeaseStore(plugin_env["lease"]) as store:
        holder = dataclasses.replace(
            Holder.airflow(dag_id="billing_nightly", run_id="r1", task_id="charge", try_number=1),
            pid=gone.pid,
        )
        lease = store.acquire(key, holder, ttl=60).lease
        other_key = "billing_nightly/charge/2024-02-16"
        store.acquire(
            other_key,
            Holder.airflow(dag_id="billing_nightly", run_id="r2", task_id="charge", try_number=1),
            ttl=60,
        )
        listener.on_task_instance_failed(
            previous_state=None, task_instance=_failed_ti("r1", 1), error="marked failed"
        )
        listener.on_task_instance_failed(  # again: nothing more happens
            previous_state=None, task_instance=_failed_ti("r1", 1), error="marked failed"
        )
        row = store.get(key)
        assert row is not None
        assert row["state"] == "failed"
        behalf = [r for r in store.history(key) if r["event"] == "fail_on_behalf"]
        assert len(behalf) == 1
        assert behalf[0]["actor"] == "listener"
        assert behalf[0]["token"] == lease.token
        # another run's lease of the same task is untouched
        assert (store.get(other_key) or {})["state"] == "running"
        # the next try is granted at once, with a higher token
        retry = Holder.airflow(
            dag_id="billing_nightly", run_id="r1", task_id="charge", try_number=2
        )
        again = store.acquire(key, retry)
        assert again.granted
        assert (again.token or 0) > lease.token


def test_a_try_reported_failed_while_its_holder_renews_is_left_to_expiry(
    plugin_env: dict[str, str],
) -> None:
    # Airflow says the try died ("killed externally", an adopted try), but its process lives
    # and renews: failing its lease now would let a retry overlap it. Only once the holder
    # has missed its renewals is the lease failed on its behalf.
    key = "billing_nightly/charge/2024-02-15"
    holder = Holder.airflow(dag_id="billing_nightly", run_id="r1", task_id="charge", try_number=1)
    with LeaseStore(plugin_env["lease"]) as store:
        lease = store.acquire(key, holder, ttl=5).lease
        keeper = LeaseKeeper(store, lease, interval=0.1).start()
        try:
            wait_for(lambda: keeper.renewals >= 2, timeout=30)
            listener.on_task_instance_failed(
                previous_state=None, task_instance=_failed_ti("r1", 1), error="killed externally"
            )
            assert (store.get(key) or {})["state"] == "running"
            assert store.acquire(key, Holder.process("retry")).outcome is Outcome.HELD
        finally:
            keeper.stop()  # the holder goes silent (its process is still this one)

        def failed_on_behalf() -> bool:
            listener.on_task_instance_failed(
                previous_state=None, task_instance=_failed_ti("r1", 1), error="killed externally"
            )
            return bool((store.get(key) or {})["state"] == "failed")

        wait_for(failed_on_behalf, timeout=30, every=0.1)
        row = store.get(key)
        assert row is not None
        behalf = [r for r in store.history(key) if r["event"] == "fail_on_behalf"]
        assert len(behalf) == 1
        # failed only after two heartbeats (AIRFLOW__EXACTLY_ONCE__HEARTBEAT=0.5) of silence
        assert (behalf[0]["at"] - row["renewed_at"]).total_seconds() >= 2 * 0.5
        assert not row["expired"] or row["expires_at"] > behalf[0]["at"]
