"""The durable task state of a lease key, on the real lease store.

Values belong to the key (every holder reads them), only the current holder writes them, and a
job is submitted once for the key: a holder that finds an earlier holder's intent without a job
id looks the job up instead of submitting a second one.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from airflow_plugins.lease import (
    Holder,
    InvalidLeaseInput,
    JobInDoubt,
    JobIntent,
    Lease,
    LeaseLost,
    LeaseStore,
    TaskState,
)
from airflow_plugins.lease.task_state import job_idempotency_key
from tests.lease.waiting import wait_for

KEY = "spark_nightly/aggregate/2024-02-15"


def holder(store: LeaseStore, name: str, ttl: float = 30.0) -> Lease:
    """A lease on KEY for ``name``, taken over from an earlier holder once that one expired."""

    def granted() -> Lease | None:
        got = store.acquire(KEY, Holder.process(name), ttl=ttl)
        return got.lease if got.granted else None

    return wait_for(granted, timeout=10, every=0.1)


class JobSystem:
    """A stand-in external job system: one job per accepted submit; a submit carrying an
    idempotency key it has seen returns that job (as Databricks' idempotency_token does)."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def submit(self, idempotency_key: str | None) -> str:
        with self._lock:
            for job in self.jobs:
                if idempotency_key is not None and job["idempotency_key"] == idempotency_key:
                    return str(job["id"])
            job_id = f"job-{len(self.jobs) + 1}"
            self.jobs.append({"id": job_id, "idempotency_key": idempotency_key})
            return job_id

    def find(self, idempotency_key: str) -> str | None:
        with self._lock:
            return next(
                (j["id"] for j in self.jobs if j["idempotency_key"] == idempotency_key), None
            )


def _events(store: LeaseStore) -> list[tuple[str, str]]:
    return [(r["event"], r["outcome"]) for r in store.history(KEY) if r["event"] != "acquire"]


def test_every_holder_of_the_key_reads_the_values_only_the_current_one_writes(
    store: LeaseStore,
) -> None:
    first = holder(store, "a", ttl=0.3)
    TaskState(store, first).set("job_id", "job-1")
    TaskState(store, first).set("progress", {"done": 3})
    second = holder(store, "b")  # took over once the first expired
    assert second.token > first.token
    state = TaskState(store, second)
    assert state.get("job_id") == "job-1"
    assert state.items() == {"job_id": "job-1", "progress": {"done": 3}}
    late = TaskState(store, first)
    for write in (
        lambda: late.set("job_id", "job-2"),
        lambda: late.delete("job_id"),
        late.clear,
    ):
        with pytest.raises(LeaseLost):
            write()
    assert state.items() == {"job_id": "job-1", "progress": {"done": 3}}
    state.set("progress", {"done": 5})
    state.delete("job_id")
    state.delete("not-there")  # a no-op, as in Airflow
    assert state.items() == {"progress": {"done": 5}}
    assert _events(store) == [
        ("state_set", "written"),
        ("state_set", "written"),
        ("state_set", "written"),
        ("state_delete", "deleted"),
    ]
    # the audit shows who wrote what
    rows = [r for r in store.history(KEY) if r["event"] == "state_set"]
    assert [(r["token"], r["output"]["value"]) for r in rows] == [
        (first.token, "job-1"),
        (first.token, {"done": 3}),
        (second.token, {"done": 5}),
    ]


def test_a_finished_lease_cannot_write_and_the_next_holder_reads_its_values(
    store: LeaseStore,
) -> None:
    first = holder(store, "a")
    TaskState(store, first).set("job_id", "job-1")
    store.fail(first, "the poll timed out")
    with pytest.raises(LeaseLost):
        TaskState(store, first).set("job_id", "job-9")
    retry = holder(store, "b")
    assert TaskState(store, retry).get("job_id") == "job-1"


def test_a_write_racing_a_takeover_is_decided_by_the_lease_row(
    store: LeaseStore, lease_db: str
) -> None:
    """The write locks the lease row: a takeover in flight makes it wait, then refuses it."""
    first = holder(store, "a")
    with psycopg.connect(lease_db, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT 1 FROM runlease.lease WHERE key = %s FOR UPDATE", (KEY,))
        refused: list[BaseException] = []

        def write() -> None:
            try:
                TaskState(store, first).set("job_id", "late")
            except LeaseLost as exc:
                refused.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        writer.join(0.5)
        assert writer.is_alive()  # waits for the row
        conn.execute(
            "UPDATE runlease.lease SET token = nextval('runlease.fencing_token'), "
            'holder = \'{"engine": "process", "name": "b"}\' WHERE key = %s',
            (KEY,),
        )
    writer.join(10)
    assert len(refused) == 1
    assert TaskState(store, first).get("job_id") is None


def test_values_are_json_not_none_and_retention_is_honoured(store: LeaseStore) -> None:
    state = TaskState(store, holder(store, "a"))
    with pytest.raises(ValueError, match="None"):
        state.set("job_id", None)
    with pytest.raises(InvalidLeaseInput, match="JSON"):
        state.set("when", object())
    with pytest.raises(InvalidLeaseInput):
        state.set("", "x")
    with pytest.raises(InvalidLeaseInput):
        state.set("x", "y", retention=timedelta(seconds=-1))
    state.set("gone", "soon", retention=timedelta(0))
    state.set("kept", "forever", retention=timedelta.max)  # Airflow's NEVER_EXPIRE
    state.set("day", "a day", retention=timedelta(days=1))
    assert state.get("gone", "default") == "default"
    assert state.items() == {"day": "a day", "kept": "forever"}
    assert _events(store) == [("state_set", "written")] * 3


def test_an_approved_rerun_starts_from_no_state(store: LeaseStore) -> None:
    first = holder(store, "a")
    TaskState(store, first).set("job_id", "job-1")
    store.complete(first, {"rows": 10})
    store.approve_rerun(KEY, actor="alice", reason="INC-7 recompute")
    rerun = holder(store, "b")
    assert rerun.generation == 1
    assert TaskState(store, rerun).get("job_id") is None


def test_a_job_is_submitted_once_and_its_id_recorded(store: LeaseStore) -> None:
    jobs = JobSystem()
    lease = holder(store, "a")
    state = TaskState(store, lease)
    seen: list[JobIntent] = []

    def submit(intent: JobIntent) -> str:
        seen.append(intent)
        assert state.intent("job_id") == intent
        return jobs.submit(intent.idempotency_key)

    assert state.submit_once("job_id", submit) == "job-1"
    assert state.get("job_id") == "job-1"
    assert seen[0].idempotency_key == job_idempotency_key(KEY, "job_id", 1)
    assert (seen[0].round, seen[0].claims) == (1, 1)
    assert state.intent("job_id") is None
    job = state.job("job_id")
    assert job is not None
    assert (job["state"], job["external_id"], job["round"]) == ("submitted", "job-1", 1)
    # the job ended in failure: the caller submits afresh, a new round with a key of its own
    assert state.submit_once("job_id", submit) == "job-2"
    assert seen[1].round == 2
    assert seen[1].idempotency_key != seen[0].idempotency_key
    assert state.get("job_id") == "job-2"
    assert _events(store) == [
        ("job_intent", "intended"),
        ("job_submitted", "submitted"),
        ("job_intent", "intended"),
        ("job_submitted", "submitted"),
    ]


def test_a_holder_superseded_between_submit_and_record_is_found_not_submitted_again(
    store: LeaseStore,
) -> None:
    jobs = JobSystem()
    first = holder(store, "a", ttl=0.3)
    taken_over: list[Lease] = []

    def submit_then_freeze(intent: JobIntent) -> str:
        job_id = jobs.submit(intent.idempotency_key)
        taken_over.append(holder(store, "b"))  # frozen past the lease: taken over meanwhile
        return job_id

    with pytest.raises(LeaseLost):
        TaskState(store, first).submit_once("job_id", submit_then_freeze)
    second = TaskState(store, taken_over[0])
    assert second.get("job_id") is None  # the first holder's record was refused

    def submit_again(intent: JobIntent) -> str:
        raise AssertionError("submitted a second job")

    found = second.submit_once(
        "job_id", submit_again, find=lambda intent: jobs.find(intent.idempotency_key)
    )
    assert found == "job-1"
    assert second.get("job_id") == "job-1"
    assert len(jobs.jobs) == 1
    assert ("job_intent", "in_doubt") in _events(store)
    assert _events(store)[-1] == ("job_submitted", "found")


def test_without_a_lookup_an_intent_in_doubt_fails_loudly_and_submits_nothing(
    store: LeaseStore,
) -> None:
    jobs = JobSystem()
    first = holder(store, "a", ttl=0.3)

    class Died(BaseException):
        pass

    def submit_and_die(intent: JobIntent) -> str:
        jobs.submit(intent.idempotency_key)
        raise Died  # the worker died before the id was recorded

    with pytest.raises(Died):
        TaskState(store, first).submit_once("job_id", submit_and_die)
    second = TaskState(store, holder(store, "b"))
    with pytest.raises(JobInDoubt, match=job_idempotency_key(KEY, "job_id", 1)):
        second.submit_once("job_id", lambda intent: jobs.submit(None))
    assert len(jobs.jobs) == 1
    # a lookup that finds nothing means no job was submitted: the next holder submits it
    third = TaskState(store, second.lease)
    assert (
        third.submit_once(
            "job_id",
            lambda intent: jobs.submit(intent.idempotency_key),
            find=lambda intent: None,
        )
        == "job-1"
    )  # the job system replays the first submit's job by its idempotency key
    assert len(jobs.jobs) == 1


def test_a_superseded_holder_cannot_claim_a_submission(store: LeaseStore) -> None:
    first = holder(store, "a", ttl=0.3)
    holder(store, "b")
    with pytest.raises(LeaseLost):
        TaskState(store, first).submit_once("job_id", lambda intent: "job-1")
