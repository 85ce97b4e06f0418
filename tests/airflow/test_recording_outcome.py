"""Recording a protected try's outcome (issue 16, items 1-4), on the real lease store and sink.

What a user sees after the work returned: the lease's state and result, the charges in the
sink, what a later try of the same business date is handed back, the audit trail. The try is
run as the task runner would run it (see conftest for the context).
"""

from __future__ import annotations

import sys
import threading
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pendulum
import psycopg
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred
from psycopg import sql

from airflow_plugins.lease import Holder, LeaseStore, fenced_transaction
from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection import protected_try
from airflow_plugins.protection.operators import ExactlyOnceOperator
from tests.airflow.conftest import task_context
from tests.conftest import ADMIN_DSN

KEY = "billing_nightly/charge/2024-02-15"
NIGHT = datetime(2024, 2, 15, 2, tzinfo=UTC)
CUSTOMERS = [f"cust-{i:03d}" for i in range(1, 7)]
EXAMPLES = Path(__file__).resolve().parents[2] / "dags"


def _operator(body: Any, op_kwargs: dict[str, Any] | None = None) -> ExactlyOnceOperator:
    with DAG(
        "billing_nightly",
        schedule="0 2 * * *",
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    ):
        return ExactlyOnceOperator(
            task_id="charge",
            python_callable=body,
            sink_conn_id="sink",
            op_kwargs={"customers": CUSTOMERS} if op_kwargs is None else op_kwargs,
        )


def _charge(fence: Fence, customer: str) -> bool:
    with fence.transaction() as tx:
        if not tx.claim(customer):
            return False
        tx.conn.execute(
            "INSERT INTO charges (run_key, customer, token) VALUES (%s, %s, %s)",
            (fence.key, customer, fence.token),
        )
    return True


def _charges(sink: str) -> list[str]:
    with psycopg.connect(sink) as conn:
        rows = conn.execute("SELECT customer FROM charges ORDER BY customer, id").fetchall()
    return [r[0] for r in rows]


def _lease(dsn: str) -> dict[str, Any]:
    with LeaseStore(dsn) as store:
        row = store.get(KEY)
    assert row is not None
    return row


class StoreOutage:
    """Makes the lease store's database refuse connections and drops the open ones (a blip of
    the store's server as a task sees it), until ``end()``."""

    def __init__(self, dsn: str) -> None:
        self.dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])

    def _allow(self, allow: bool) -> None:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                    sql.Identifier(self.dbname), sql.Literal(allow)
                )
            )
            if not allow:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.dbname,),
                )

    def begin(self, seconds: float) -> None:
        """Starts the outage; it ends by itself after ``seconds``."""
        self._allow(False)
        self._timer = threading.Timer(seconds, self._allow, (True,))
        self._timer.start()

    def end(self) -> None:
        """Ends it now (idempotent)."""
        self._timer.cancel()
        self._allow(True)


# -- 1. the work returned: its completion is recorded, never the work run again ---------------


def test_a_store_blip_while_completing_is_retried_and_the_work_never_runs_again(
    plugin_env: dict[str, str],
) -> None:
    outage = StoreOutage(plugin_env["lease"])
    calls: list[int] = []

    def charge_then_blip(fence: Fence, customers: list[str]) -> dict[str, int]:
        calls.append(fence.token)
        charged = sum(_charge(fence, c) for c in customers)
        outage.begin(seconds=2.0)  # the store goes away as the work returns
        return {"charged": charged}

    op = _operator(charge_then_blip)
    try:
        assert op.execute(task_context(op, logical_date=NIGHT)) == {"charged": 6}
    finally:
        outage.end()
    row = _lease(plugin_env["lease"])
    assert (row["state"], row["result"]) == ("succeeded", {"charged": 6})
    # the next try (a clear, a second run of the date) is handed the result; nothing re-runs
    again = op.execute(task_context(op, logical_date=NIGHT, try_number=2))
    assert again == {"charged": 6}
    assert len(calls) == 1
    assert _charges(plugin_env["sink"]) == CUSTOMERS


def test_a_result_that_is_not_json_is_recorded_and_handed_back_with_its_types(
    plugin_env: dict[str, str],
) -> None:
    at = datetime(2024, 2, 15, 2, 41, 7, tzinfo=UTC)
    calls: list[int] = []

    def charge(fence: Fence, customers: list[str]) -> dict[str, Any]:
        calls.append(fence.token)
        total = sum(_charge(fence, c) for c in customers)
        return {"charged": total, "amount": Decimal("1234.56"), "finished_at": at}

    op = _operator(charge)
    first = op.execute(task_context(op, logical_date=NIGHT))
    assert _lease(plugin_env["lease"])["state"] == "succeeded"
    # the user's natural move after any doubt: clear the task; it is handed the result back
    cleared = op.execute(task_context(op, logical_date=NIGHT, try_number=2))
    assert len(calls) == 1
    assert _charges(plugin_env["sink"]) == CUSTOMERS
    for result in (first, cleared):
        assert result == {"charged": 6, "amount": Decimal("1234.56"), "finished_at": at}
        assert type(result["amount"]) is Decimal
        assert isinstance(result["finished_at"], datetime)


# -- 2. a stopped fence is never recorded as success -------------------------------------------


def test_a_body_that_swallows_a_stopped_fence_is_not_completed(
    plugin_env: dict[str, str],
) -> None:
    tokens: list[int] = []

    def billing_with_per_item_errors(fence: Fence, customers: list[str]) -> dict[str, int]:
        tokens.append(fence.token)
        charged = 0
        for n, customer in enumerate(customers):
            if len(tokens) == 1 and n == 2:
                # the worker is shutting down: its handler stops the fence (the lease is kept,
                # as the policy's on_kill keeps it, to expire)
                protected_try.stop_active_try("worker shutting down", release=False)
            try:  # a common style: one customer's error must not stop the others
                fence.check()
                charged += _charge(fence, customer)
            except Exception:
                continue
        return {"charged": charged}

    op = _operator(billing_with_per_item_errors)
    with pytest.raises(Exception, match="stopped"):
        op.execute(task_context(op, logical_date=NIGHT))
    row = _lease(plugin_env["lease"])
    assert row["state"] != "succeeded"
    assert row["result"] is None
    # the retry finishes from the ledger: every customer once, and a whole result
    assert op.execute(task_context(op, logical_date=NIGHT, try_number=2)) == {"charged": 4}
    assert _charges(plugin_env["sink"]) == CUSTOMERS
    assert tokens[1] > tokens[0]


# -- 3. after a takeover the result describes the key's whole work -----------------------------


@pytest.fixture
def billing(monkeypatch: pytest.MonkeyPatch, plugin_env: dict[str, str]) -> Any:
    """The example DAGs' billing module, its tables made on the sink."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import billing_charges

    billing_charges.prepare_sink(plugin_env["sink"])
    yield billing_charges
    sys.modules.pop("billing_charges", None)


def test_after_a_takeover_the_example_billing_result_counts_every_holders_work(
    plugin_env: dict[str, str], billing: Any
) -> None:
    names = billing.customers(8)
    # the first try charged 3 customers, then its scheduler died and its lease expired
    with LeaseStore(plugin_env["lease"]) as store:
        dead = store.acquire(KEY, Holder.process("the dead try"), ttl=0.3).lease
    first = Fence(
        key=KEY,
        token=dead.token,
        attempt=1,
        business_date="2024-02-15",
        lease=dead,
        sink_connect=lambda: psycopg.connect(plugin_env["sink"], autocommit=True),
    )
    try:
        assert billing.charge_customers(first, names[:3], delay=0, writer="try1")["charged"] == 3
    finally:
        first.close()

    op = _operator(
        billing.charge_customers, op_kwargs={"names": names, "delay": 0, "writer": "try2"}
    )
    result = None
    for _ in range(100):  # until the dead try's lease expires and this one takes it over
        try:
            result = op.execute(task_context(op, logical_date=NIGHT, try_number=2))
            break
        except TaskDeferred:
            threading.Event().wait(0.1)
    assert result is not None
    with LeaseStore(plugin_env["lease"]) as store:
        assert [r["outcome"] for r in store.history(KEY) if r["event"] == "acquire"][-1] == (
            "taken_over"
        )
    # the invoice mail downstream sees the night's whole billing, not the last holder's part
    assert result["charged"] == 8
    assert _lease(plugin_env["lease"])["result"]["charged"] == 8
    with psycopg.connect(plugin_env["sink"]) as conn:
        rows = conn.execute("SELECT customer FROM billing.charges ORDER BY customer").fetchall()
    assert [r[0] for r in rows] == names


# -- 4. an approved re-run re-does the effects, once ------------------------------------------


def test_an_approved_rerun_redoes_every_effect_once_without_touching_the_ledger(
    plugin_env: dict[str, str],
) -> None:
    calls: list[int] = []

    def charge(fence: Fence, customers: list[str]) -> dict[str, int]:
        calls.append(fence.token)
        return {"charged": sum(_charge(fence, c) for c in customers)}

    op = _operator(charge)
    assert op.execute(task_context(op, logical_date=NIGHT)) == {"charged": 6}
    rerun = {"business_date": "2024-02-15", "exactly_once_rerun": {"reason": "INC-42 re-bill"}}
    with LeaseStore(plugin_env["lease"]) as store:  # as the page's approve action does
        store.approve_rerun(KEY, actor="alice", reason="INC-42 re-bill")
    ctx = task_context(op, run_id="manual__rerun", conf=rerun, triggering_user="alice")
    assert op.execute(ctx) == {"charged": 6}
    # a retry of the re-run, and a later run of the date, do not charge a third time
    again = task_context(
        op, run_id="manual__rerun", conf=rerun, triggering_user="alice", try_number=2
    )
    assert op.execute(again) == {"charged": 6}
    assert op.execute(task_context(op, logical_date=NIGHT, try_number=3)) == {"charged": 6}
    assert len(calls) == 2
    assert _charges(plugin_env["sink"]) == sorted(CUSTOMERS * 2)
    with LeaseStore(plugin_env["lease"]) as store:
        approvals = [r for r in store.history(KEY) if r["event"] == "approve_rerun"]
    assert [(a["actor"], a["outcome"]) for a in approvals] == [("alice", "approved")]
    assert approvals[0]["output"] == {"generation": 1}
    # the first run's token cannot write into the new generation
    with psycopg.connect(plugin_env["sink"], autocommit=True) as conn:
        with pytest.raises(Exception, match="token"):
            with fenced_transaction(conn, KEY, calls[0]):
                pass


def test_a_policy_wrapped_export_under_a_store_blip_is_completed_not_run_again(
    plugin_env: dict[str, str],
) -> None:
    # an unfenced body (the cluster policy's wrapping): only the lease stands between a blip at
    # completion and the export done twice
    from airflow.providers.standard.operators.python import PythonOperator

    from airflow_plugins.protection import policy

    outage = StoreOutage(plugin_env["lease"])
    exports: list[str] = []

    def export() -> str:
        exports.append("s3://exports/2024-02-15.csv")
        outage.begin(seconds=2.0)
        return exports[-1]

    with DAG(
        "nightly_export",
        schedule="0 2 * * *",
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        tags=["exactly-once"],
    ):
        task = PythonOperator(task_id="export", python_callable=export)
    policy.wrap(task)
    try:
        first = task.execute(context=task_context(task, logical_date=NIGHT))
    finally:
        outage.end()
    cleared = task.execute(context=task_context(task, logical_date=NIGHT, try_number=2))
    assert first == cleared == "s3://exports/2024-02-15.csv"
    assert len(exports) == 1
    with LeaseStore(plugin_env["lease"]) as store:
        row = store.get("nightly_export/export/2024-02-15")
    assert row is not None
    assert (row["state"], row["result"]) == ("succeeded", first)
