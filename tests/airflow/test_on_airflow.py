"""The operator on real Airflow (engineer C's harness).

* A held lease defers the task to the triggerer, holding no worker slot and using no retry; the
  release resumes it; a second run of the date returns the recorded result without running; the
  listener audits the tries (in the task processes) and both runs (in the scheduler) and flags
  the second run.
* An unreachable lease store (a private PostgreSQL this module starts and stops, the task's own
  ``lease_conn_id``) defers the task: no retry used, the body never runs while the store is
  down, the run completes once it is back.
* Clearing a running protected task: Airflow's supervisor SIGTERMs it, ``on_kill`` stops the body
  and releases the lease (audited), and the next try is granted at once and finishes the rest.
* Marking a running try failed through the REST API: the API server's listener fails its lease
  on its behalf (actor ``listener``); the body stops; the next try gets a higher token.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres
from airflow_plugins.demo.stack import SCHEDULERS
from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore, migrate
from tests.harness.airflow_harness import (
    EXTRA_DAG_FOLDERS,
    EXTRA_ENV,
    AirflowHarness,
    pid_alive,
    sleep_at_least,
    wait_for,
)
from tests.harness.fixtures import airflow  # noqa: F401  (the session fixture)

EXTRA_DAG_FOLDERS["plugin_b"] = Path(__file__).parent / "on_airflow_dags"
DAG_ID = "b_deferral"

# the private lease store of DAG b_store_outage (engineer B's port range: 26000-26999)
OUTAGE_PORT = 26432
OUTAGE_DB = "leases"
EXTRA_ENV["AIRFLOW_CONN_B_OUTAGE_LEASES"] = (
    f"postgres://postgres@127.0.0.1:{OUTAGE_PORT}/{OUTAGE_DB}"
)


@pytest.fixture
def runs_table(airflow: AirflowHarness) -> str:  # noqa: F811
    with psycopg.connect(airflow.sink_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS b_deferral_runs "
            "(key text NOT NULL, token bigint NOT NULL, try_number int NOT NULL)"
        )
    return airflow.sink_dsn


def _rows(sink: str, key: str) -> list[tuple[int, int]]:
    with psycopg.connect(sink) as conn:
        return conn.execute(
            "SELECT token, try_number FROM b_deferral_runs WHERE key = %s", (key,)
        ).fetchall()


@pytest.mark.slow
def test_held_lease_defers_to_the_triggerer_and_resumes_without_a_retry(
    airflow: AirflowHarness,  # noqa: F811
    runs_table: str,
) -> None:
    day = airflow.fresh_business_date()
    key = f"{DAG_ID}/charge/{day}"
    with airflow.lease_store() as store:
        held = store.acquire(key, Holder.process("the test holds it"), ttl=300).lease
        run_id = airflow.trigger_dag_run(DAG_ID, {"business_date": day})
        airflow.wait_for_task_state(DAG_ID, run_id, "charge", {"deferred"})
        assert _rows(runs_table, key) == []
        store.release(held, "the test lets go")
        run = airflow.wait_for_run_state(DAG_ID, run_id)
        assert run["state"] == "success"
        rows = _rows(runs_table, key)
        assert len(rows) == 1
        token, try_number = rows[0]
        assert try_number == 1  # the wait used no retry (retries=0 would have failed)
        assert token > held.token
        lease = store.get(key)
        assert lease is not None
        assert lease["state"] == "succeeded"
        assert lease["holder"]["run_id"] == run_id

        again = airflow.trigger_dag_run(DAG_ID, {"business_date": day})
        assert airflow.wait_for_run_state(DAG_ID, again)["state"] == "success"
        assert _rows(runs_table, key) == rows  # not charged again

        run_key = f"{DAG_ID}/_dag_run/{day}"

        def audited() -> list[str]:
            events = [r["event"] for r in store.history(run_key)]
            return (
                events if "duplicate_run" in events and events.count("dag_run_success") == 2 else []
            )

        events = wait_for(audited, timeout=60, what="the listener's DAG-run audit rows")
        assert events.count("dag_run_running") == 2
        history = store.history(key)
        acquires = [r["outcome"] for r in history if r["event"] == "acquire"]
        assert acquires == ["granted", "held", "granted", "succeeded"]
        # every try is in the audit trail: who asked, with which try number, and how it ended
        tries = [
            (r["event"], r["outcome"], r["holder"].get("run_id"), r["holder"].get("try_number"))
            for r in history
            if r["event"] in ("acquire", "complete")
        ]
        assert tries[-3:] == [
            ("acquire", "granted", run_id, 1),
            ("complete", "succeeded", run_id, 1),
            ("acquire", "succeeded", again, 1),
        ]


@pytest.mark.slow
def test_the_policy_protects_each_named_instance_of_a_mapped_task(
    airflow: AirflowHarness,  # noqa: F811
    runs_table: str,
) -> None:
    day = airflow.fresh_business_date()
    dag_id = "b_policy_mapped"
    first = airflow.trigger_dag_run(dag_id, {"business_date": day})
    assert airflow.wait_for_run_state(dag_id, first)["state"] == "success"
    second = airflow.trigger_dag_run(dag_id, {"business_date": day})
    assert airflow.wait_for_run_state(dag_id, second)["state"] == "success"
    with psycopg.connect(runs_table) as conn:
        rows = conn.execute(
            "SELECT key FROM b_deferral_runs WHERE key LIKE %s ORDER BY key", (f"{day}/%",)
        ).fetchall()
    assert [r[0] for r in rows] == [f"{day}/acme", f"{day}/globex", f"{day}/initech"]
    with airflow.lease_store() as store:
        for tenant in ("acme", "globex", "initech"):
            lease = store.get(f"{dag_id}/notify/{day}/{tenant}")
            assert lease is not None
            assert lease["state"] == "succeeded"
            assert lease["result"] == f"notified {tenant}"
            assert lease["holder"]["run_id"] == first


# -- the lease store down, on_kill, the listener failing a marked try ---------------------------


@pytest.fixture
def item_rows(airflow: AirflowHarness) -> str:  # noqa: F811
    with psycopg.connect(airflow.sink_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS b_on_airflow_rows (key text NOT NULL, item text NOT NULL, "
            "token bigint NOT NULL, try_number int NOT NULL, "
            "written_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
    return airflow.sink_dsn


def _item_rows(sink: str, key: str) -> list[dict[str, Any]]:
    with psycopg.connect(sink) as conn:
        cur = conn.execute(
            "SELECT item, token, try_number, written_at FROM b_on_airflow_rows WHERE key = %s "
            "ORDER BY written_at",
            (key,),
        )
        names = [d.name for d in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


@pytest.fixture
def outage_store() -> Iterator[EmbeddedPostgres]:
    """The private PostgreSQL behind Connection ``b_outage_leases``, migrated, running."""
    server = EmbeddedPostgres(OUTAGE_PORT)
    server.destroy()  # a clean data folder, whatever an earlier run left
    server.start()
    try:
        migrate(server.create_database(OUTAGE_DB), LEASE_STORE)
        yield server
    finally:
        server.destroy()


@pytest.mark.slow
def test_an_unreachable_lease_store_defers_the_task_and_the_run_completes_when_it_is_back(
    airflow: AirflowHarness,  # noqa: F811
    item_rows: str,
    outage_store: EmbeddedPostgres,
) -> None:
    dag_id = "b_store_outage"
    day = airflow.fresh_business_date()
    key = f"{dag_id}/charge/{day}"
    outage_store.stop()
    run_id = airflow.trigger_dag_run(dag_id, {"business_date": day})
    ti = airflow.wait_for_task_state(dag_id, run_id, "charge", {"deferred"})
    assert ti["try_number"] == 1
    # the store stays down while the triggerer polls it (every second here): nothing runs.
    # Long enough that the scheduler has handled the executor's event of the deferring
    # process before the trigger fires: Airflow 3.3 fails a try whose late "success" event
    # arrives once the resumed try is queued (seen with two loaded schedulers at ~6 s).
    sleep_at_least(15)
    still = airflow.client().task_state(dag_id, run_id, "charge")
    assert still is not None
    assert (still["state"], still["try_number"]) == ("deferred", 1)
    assert _item_rows(item_rows, key) == []
    assert "lease store unreachable" in airflow.task_log(dag_id, run_id, "charge", 1)

    back_at = datetime.now(UTC)
    outage_store.start()
    run = airflow.wait_for_run_state(dag_id, run_id)
    assert run["state"] == "success"
    rows = _item_rows(item_rows, key)
    assert len(rows) == 1
    assert rows[0]["try_number"] == 1  # retries=0: a used retry would have failed the run
    assert rows[0]["written_at"] >= back_at  # the body ran only once the store answered
    with LeaseStore(outage_store.dsn(OUTAGE_DB)) as store:
        lease = store.get(key)
        assert lease is not None
        assert (lease["state"], lease["token"]) == ("succeeded", rows[0]["token"])
        assert lease["holder"]["run_id"] == run_id
    with airflow.lease_store() as shared:
        assert shared.get(key) is None  # the task's own lease Connection was used


@pytest.mark.slow
def test_clearing_a_running_protected_task_stops_it_and_releases_its_lease(
    airflow: AirflowHarness,  # noqa: F811
    item_rows: str,
) -> None:
    dag_id = "b_stoppable"
    items = 40
    day = airflow.fresh_business_date()
    key = f"{dag_id}/charge/{day}"
    run_id = airflow.trigger_dag_run(dag_id, {"business_date": day, "items": items, "delay": 0.5})
    wait_for(lambda: len(_item_rows(item_rows, key)) >= 3, timeout=180, what="the first writes")
    first_token = _item_rows(item_rows, key)[0]["token"]
    airflow.clear_task(dag_id, run_id, "charge")
    cleared = time.monotonic()
    with airflow.lease_store() as store:
        released = wait_for(
            lambda: [r for r in store.history(key) if r["event"] == "release"],
            timeout=60,
            what="on_kill to release the lease",
        )
        stop_seconds = time.monotonic() - cleared
        assert airflow.wait_for_run_state(dag_id, run_id)["state"] == "success"
        history = store.history(key)

    release = released[0]
    assert release["token"] == first_token
    assert release["holder"]["try_number"] == 1
    assert "on_kill" in release["reason"]
    assert stop_seconds < 30  # Airflow tells the supervisor at its next heartbeat
    # the next try was granted at once (the lease was released, not left to expire)
    acquires = [
        (r["outcome"], r["holder"]["try_number"]) for r in history if r["event"] == "acquire"
    ]
    assert acquires == [("granted", 1), ("granted", 2)]

    rows = _item_rows(item_rows, key)
    assert sorted(r["item"] for r in rows) == [f"item-{n:03d}" for n in range(items)]
    first = [r for r in rows if r["try_number"] == 1]
    second = [r for r in rows if r["try_number"] == 2]
    assert 3 <= len(first) < items  # the body stopped mid-run
    assert {r["token"] for r in first} == {first_token}
    assert second
    assert all(r["token"] > first_token for r in second)
    assert max(r["written_at"] for r in first) < min(r["written_at"] for r in second)
    # a write already in flight may land, then nothing more after the release
    assert (max(r["written_at"] for r in first) - release["at"]).total_seconds() < 2


@pytest.mark.slow
def test_a_try_marked_failed_has_its_lease_ended_without_waiting_for_expiry(
    airflow: AirflowHarness,  # noqa: F811
    item_rows: str,
) -> None:
    dag_id = "b_stoppable"
    items = 40
    day = airflow.fresh_business_date()
    key = f"{dag_id}/charge/{day}"
    run_id = airflow.trigger_dag_run(dag_id, {"business_date": day, "items": items, "delay": 0.5})
    procs = airflow.wait_for_task_processes(dag_id, run_id, "charge")
    wait_for(lambda: len(_item_rows(item_rows, key)) >= 3, timeout=180, what="the first writes")
    first_token = _item_rows(item_rows, key)[0]["token"]
    airflow.client().request(
        "PATCH",
        f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/charge",
        json={"new_state": "failed"},
    )
    # the API server's listener does not fail the lease while the try's process still renews
    # it (issue 16 item 8): the try, told by its supervisor, ends it itself (on_kill releases
    # it), or the listener fails it once the holder is shown gone
    ends = ("release", "fail", "fail_on_behalf")
    with airflow.lease_store() as store:
        failed = wait_for(
            lambda: [r for r in store.history(key) if r["event"] in ends],
            timeout=60,
            what="the lease to be ended",
        )
        lease = store.get(key)
        assert lease is not None
        assert lease["state"] in ("failed", "released")
        assert lease["token"] == first_token
        # the old try's process ends (its keeper loses the lease; the supervisor SIGTERMs it)
        wait_for(lambda: not pid_alive(procs.task), timeout=60, what="the old try to end")
        stopped = len(_item_rows(item_rows, key))
        assert stopped < items

        airflow.clear_task(dag_id, run_id, "charge")  # the user's retry
        assert airflow.wait_for_run_state(dag_id, run_id)["state"] == "success"
        history = store.history(key)

    fail = failed[0]
    assert fail["token"] == first_token
    assert fail["holder"]["try_number"] == 1
    acquires = [(r["outcome"], r["token"]) for r in history if r["event"] == "acquire"]
    assert [a[0] for a in acquires] == ["granted", "granted"]
    assert acquires[1][1] > first_token  # a new, higher token, with no wait for expiry
    rows = _item_rows(item_rows, key)
    assert sorted(r["item"] for r in rows) == [f"item-{n:03d}" for n in range(items)]
    assert sum(r["try_number"] == 1 for r in rows) == stopped
    assert {r["token"] for r in rows if r["try_number"] != 1} == {acquires[1][1]}


def test_each_airflow_job_warms_the_lease_store_as_it_starts(
    airflow: AirflowHarness,  # noqa: F811
) -> None:
    # the listener's start hook, in the real components: a scheduler warms the store before its
    # LocalExecutor forks the workers its task processes are forked from
    airflow.ensure_schedulers()
    commands = {name: "airflow scheduler" for name in SCHEDULERS} | {
        "triggerer": "airflow triggerer",
        "dag-processor": "airflow dag-processor",
    }
    for name, command in commands.items():
        text = (airflow.stack.home / f"{name}.log").read_text(errors="replace")
        assert f"lease store warmed as an Airflow job starts ({command}), before it forks" in (
            text
        ), name
        assert "lease store not reachable as an Airflow job starts" not in text, name
        if name in SCHEDULERS:  # before the LocalExecutor started (forked) its first worker
            forked = text.find("Worker starting up")  # the LocalExecutor's, at INFO
            assert 0 <= text.find("lease store warmed") < forked, name
    # the api-server runs no job: it has nothing to fork and never warms
    api_log = (airflow.stack.home / "api-server.log").read_text(errors="replace")
    assert "lease store warmed" not in api_log
