"""``@exactly_once_task``: the fence as first argument or keyword, TaskFlow arguments, mapping."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pendulum
import psycopg
import pytest
from airflow.sdk import DAG

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import ExactlyOnceDecoratedOperator, exactly_once_task
from tests.airflow.conftest import task_context

NIGHT = datetime(2024, 2, 15, 2, tzinfo=UTC)
calls: list[tuple[str, Any]] = []


@exactly_once_task(sink_conn_id="sink")
def charge_first(fence: Fence, customers: list[str], ti: Any = None) -> dict[str, Any]:
    calls.append(("first", fence.token))
    with fence.transaction() as tx:
        for customer in tx.claim_many(customers):
            tx.conn.execute(
                "INSERT INTO charges (run_key, customer, token) VALUES (%s, %s, %s)",
                (fence.key, customer, fence.token),
            )
    return {"charged": len(customers), "try": ti.try_number}


@exactly_once_task(task_id="by_keyword")
def charge_keyword(amount: int, *, fence: Fence) -> int:
    calls.append(("keyword", fence.token))
    return amount * 2


@exactly_once_task(map_index_template="{{ tenant }}")
def per_tenant(tenant: str, fence: Fence) -> str:
    calls.append(("tenant", fence.key))
    return tenant


def _dag() -> DAG:
    with DAG(
        "webhooks", schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1, tz="UTC")
    ) as dag:
        charge_first(customers=["a", "b", "c"])
        charge_keyword(21)
        per_tenant.expand(tenant=["acme", "globex"])
    return dag


def test_the_decorated_operator_is_protected_with_retry_defaults() -> None:
    dag = _dag()
    op = dag.get_task("charge_first")
    assert isinstance(op, ExactlyOnceDecoratedOperator)
    assert op.retries == 4
    assert op.sink_conn_id == "sink"
    mapped = dag.get_task("per_tenant")
    assert mapped.partial_kwargs["retries"] == 4  # mapped tasks get the defaults too


def test_a_callable_without_a_fence_is_refused_at_parse_time() -> None:
    def no_fence(x: int) -> int:
        return x

    with DAG("bad", schedule=None, start_date=pendulum.datetime(2024, 1, 1)):
        make = exactly_once_task(no_fence)
        with pytest.raises(TypeError, match="must take the fence"):
            make(1)


def test_fence_first_and_context_keys(plugin_env: dict[str, str]) -> None:
    calls.clear()
    op = _dag().get_task("charge_first")
    context = task_context(op, logical_date=NIGHT, try_number=1)
    assert op.execute(context) == {"charged": 3, "try": 1}
    # a second try of the business date: not run again, same value for XCom
    assert op.execute(task_context(op, logical_date=NIGHT, try_number=2)) == {
        "charged": 3,
        "try": 1,
    }
    assert [c[0] for c in calls] == ["first"]
    with psycopg.connect(plugin_env["sink"]) as conn:
        assert conn.execute("SELECT count(*) FROM charges").fetchone() == (3,)


def test_fence_as_keyword(plugin_env: dict[str, str]) -> None:
    calls.clear()
    op = _dag().get_task("by_keyword")
    assert op.execute(task_context(op, logical_date=NIGHT)) == 42
    assert calls[0][0] == "keyword"
    assert calls[0][1] > 0
    with LeaseStore(plugin_env["lease"]) as store:
        row = store.get("webhooks/by_keyword/2024-02-15")
    assert row is not None
    assert row["result"] == 42


def test_a_mapped_instance_is_keyed_on_its_tenant(plugin_env: dict[str, str]) -> None:
    calls.clear()
    mapped = _dag().get_task("per_tenant")
    op = mapped.unmap({"op_kwargs": {"tenant": "globex"}})
    context = task_context(op, logical_date=NIGHT, map_index=1, rendered_map_index="globex")
    assert op.execute(context) == "globex"
    assert calls == [("tenant", "webhooks/per_tenant/2024-02-15/globex")]
