"""Each least-privilege role of the lease store, connected as itself: what it can and cannot do.

Roles are cluster-wide, so each test creates its own (unique names) on the shared server and
drops them after. The task role runs a whole try (acquire, renew, complete, a failed try, a
listener's fail_on_behalf, an audit record) but cannot force-release, approve a re-run, delete
a lease or change, delete or truncate any audit row; the reader only reads; the operator makes
the administrative changes; even a role granted UPDATE on the audit by mistake is refused by
the trigger. The owner (runlease maintain) still manages partitions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import date
from typing import Any

import psycopg
import pytest
from psycopg import sql

from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore, TaskState, migrate
from airflow_plugins.lease.roles import grant_roles
from tests.conftest import create_database, drop_database

KEY = "roles_dag/charge/2024-02-15"
DENIED_KEY = "roles_denied/charge/2024-02-15"
OPERATOR_KEY = "roles_operator/charge/2024-02-15"


@pytest.fixture(scope="module")
def lease_db() -> Iterator[str]:
    """One lease store for the module (a database and migration per test cost seconds)."""
    dsn = create_database("eoroles")
    migrate(dsn, LEASE_STORE)
    try:
        yield dsn
    finally:
        drop_database(dsn)


@pytest.fixture(scope="module")
def roles(lease_db: str) -> Iterator[dict[str, str]]:
    """Three new login roles with the grants (and one given audit rights by mistake), and
    their DSNs; dropped after."""
    suffix = uuid.uuid4().hex[:10]
    names = {kind: f"eo_{kind}_{suffix}" for kind in ("task", "operator", "reader", "mistake")}
    with psycopg.connect(lease_db, autocommit=True) as conn:
        for name in names.values():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        grant_roles(
            lease_db, task=names["task"], operator=names["operator"], reader=names["reader"]
        )
        with psycopg.connect(lease_db, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "GRANT USAGE ON SCHEMA runlease TO {0}; "
                    "GRANT SELECT, UPDATE, DELETE ON runlease.audit TO {0}"
                ).format(sql.Identifier(names["mistake"]))
            )
        yield {k: f"{lease_db} user={v}" for k, v in names.items()}
    finally:
        with psycopg.connect(lease_db, autocommit=True) as conn:
            for name in names.values():
                role = sql.Identifier(name)
                conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
                conn.execute(sql.SQL("DROP ROLE {}").format(role))


def _sql(dsn: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode(), params)  # type: ignore[call-overload]


def test_the_task_role_runs_a_whole_try_and_appends_to_the_audit(
    roles: dict[str, str], lease_db: str
) -> None:
    with LeaseStore(roles["task"]) as store:
        holder = Holder.process("task-role")
        lease = store.acquire(KEY, holder, ttl=600).lease
        store.renew(lease)
        store.complete(lease, {"charged": 3})
        again = store.acquire(KEY, holder, ttl=600)
        assert again.result == {"charged": 3}
        failing = store.acquire("roles_dag/refund/2024-02-15", holder, ttl=600).lease
        store.fail(failing, "boom")
        other = store.acquire("roles_dag/notify/2024-02-15", holder, ttl=600).lease
        assert (
            store.fail_on_behalf(
                other.key, {"name": "task-role"}, actor="listener", reason="try failed"
            )
            == other.token
        )
        store.record_event(KEY, "duplicate_run", outcome="blocked", reason="second run")
        assert [r["event"] for r in store.history(KEY)][-1] == "duplicate_run"


def test_the_task_role_keeps_a_keys_task_state_and_submits_its_job(
    roles: dict[str, str],
) -> None:
    key = "roles_dag/spark/2024-02-15"
    with LeaseStore(roles["task"]) as store:
        lease = store.acquire(key, Holder.process("task-role"), ttl=600).lease
        state = TaskState(store, lease)
        state.set("progress", {"done": 1})
        assert state.submit_once("job_id", lambda intent: "job-1") == "job-1"
        state.delete("progress")
        state.clear()
        store.complete(lease, {"job_id": "job-1"})
    with LeaseStore(roles["reader"]) as reader:
        assert [r["event"] for r in reader.history(key)][-3:-1] == ["state_delete", "state_clear"]


DENIED: list[tuple[str, str, str]] = [
    (
        "task",
        "force-release",
        "SELECT * FROM runlease.force_release('roles_dag/charge/2024-02-15', 'me', 'r')",
    ),
    (
        "task",
        "approve a re-run",
        "SELECT runlease.approve_rerun('roles_dag/charge/2024-02-15', NULL, 'me', 'r')",
    ),
    ("task", "delete a lease", "DELETE FROM runlease.lease"),
    ("task", "rewrite the audit", "UPDATE runlease.audit SET outcome = 'granted'"),
    ("task", "delete the audit", "DELETE FROM runlease.audit"),
    ("task", "truncate the audit", "TRUNCATE runlease.audit"),
    ("task", "drop a partition", "DROP TABLE runlease.audit_default"),
    ("task", "prune", "SELECT * FROM runlease.prune(1, 1)"),
    ("task", "reset the token sequence", "SELECT setval('runlease.fencing_token', 1)"),
    ("task", "create a table", "CREATE TABLE runlease.evil (x int)"),
    ("reader", "write a lease", "UPDATE runlease.lease SET state = 'failed'"),
    (
        "reader",
        "append to the audit",
        "INSERT INTO runlease.audit (key, event, outcome) VALUES ('a/b/c', 'x', 'y')",
    ),
    ("reader", "acquire", "SELECT nextval('runlease.fencing_token')"),
    ("reader", "write task state", "DELETE FROM runlease.task_state"),
    ("operator", "rewrite the audit", "UPDATE runlease.audit SET outcome = 'granted'"),
    ("operator", "delete the audit", "DELETE FROM runlease.audit"),
    (
        "mistake",
        "rewrite the audit (granted by mistake)",
        "UPDATE runlease.audit SET outcome = 'granted'",
    ),
    ("mistake", "delete the audit (granted by mistake)", "DELETE FROM runlease.audit"),
]


def test_what_each_role_cannot_do(roles: dict[str, str], lease_db: str) -> None:
    with LeaseStore(lease_db) as owner:
        lease = owner.acquire(DENIED_KEY, Holder.process("owner"), ttl=600).lease
        owner.complete(lease, {"charged": 3})
        before = owner.history(DENIED_KEY)
    allowed = []
    for role, what, statement in DENIED:
        try:
            _sql(roles[role], statement.replace(KEY, DENIED_KEY))
        except psycopg.errors.InsufficientPrivilege:
            continue
        allowed.append(f"{role}: {what}")
    assert allowed == []
    with LeaseStore(lease_db) as owner:
        assert owner.history(DENIED_KEY) == before
        assert (owner.get(DENIED_KEY) or {})["state"] == "succeeded"


def test_the_reader_reads_and_the_operator_changes(roles: dict[str, str], lease_db: str) -> None:
    with LeaseStore(lease_db) as owner:
        running = owner.acquire(OPERATOR_KEY, Holder.process("owner"), ttl=600).lease
    with LeaseStore(roles["reader"]) as reader:
        assert (reader.get(OPERATOR_KEY) or {})["token"] == running.token
        assert reader.history(OPERATOR_KEY)
    with LeaseStore(roles["operator"]) as operator:
        assert operator.force_release(OPERATOR_KEY, actor="ops", reason="stuck") == running.token
        assert operator.approve_rerun(OPERATOR_KEY, actor="ops", reason="again") in (
            "approved",
            "not_needed",
        )
    with LeaseStore(lease_db) as owner:
        assert [r["actor"] for r in owner.history(OPERATOR_KEY)][-1] == "ops"
        # the owner still manages partitions (runlease maintain)
        assert owner.ensure_audit_partitions(date(2031, 1, 1), date(2031, 3, 1)) >= 1
