"""Map keys of mapped tasks: one injective escaping for both engines, and a loud collision.

Two tenants whose names differ must never share a lease key (the second would be handed the
first one's result and never charged); two map indexes of one run that do render the same key
fail, naming both, instead of one silently skipping the other.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pendulum
import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from airflow_plugins.lease import LeaseStore
from airflow_plugins.protection.operators import ExactlyOnceOperator
from airflow_plugins.protection.task_identity import target_from_context
from bridge.identity import map_key_of
from tests.airflow.conftest import task_context

NIGHT = datetime(2024, 2, 15, 2, tzinfo=UTC)
# each pair collided before: '/' and ' ' were replaced by '_', surrounding blanks stripped
TENANTS = ["acme/eu", "acme_eu", "acme_eu ", " acme_eu", "acme eu", "acme%2Feu", "acme%eu"]


def _mapped_task() -> EmptyOperator:
    with DAG("webhooks", schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
        return EmptyOperator(task_id="send", map_index_template="{{ tenant }}")


def _airflow_map_key(tenant: object, index: int = 0) -> str | None:
    task = _mapped_task()
    task.op_kwargs = {"tenant": tenant}  # type: ignore[attr-defined]
    context = task_context(task, logical_date=NIGHT, map_index=index)
    context["map_index_template"] = "{{ tenant }}"
    return target_from_context(context).key.map_key


def test_tenants_that_differ_get_different_keys_the_same_in_both_engines() -> None:
    airflow = [_airflow_map_key(t) for t in TENANTS]
    bridge = [map_key_of(t, None) for t in TENANTS]
    assert len(set(airflow)) == len(TENANTS), airflow
    assert airflow == bridge


@pytest.mark.parametrize("tenant", ["tenant-42", "acme.eu", "a:b@c+d=e", 42, "ACME_EU-1"])
def test_a_name_that_was_safe_keys_as_before_in_both_engines(tenant: object) -> None:
    # keys already recorded for such names must still match
    assert _airflow_map_key(tenant) == map_key_of(tenant, None) == str(tenant)


@pytest.mark.parametrize("tenant", ["a<b>&c", "Zürich", "acme eu", "50%"])
def test_a_name_airflow_kept_keys_as_before_in_airflow(tenant: str) -> None:
    assert _airflow_map_key(tenant) == tenant


def _operator(body: Any) -> ExactlyOnceOperator:
    with DAG("webhooks", schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
        return ExactlyOnceOperator(
            task_id="send", python_callable=body, map_index_template="{{ tenant }}"
        )


def test_two_map_indexes_of_one_run_with_one_key_fail_naming_both(
    plugin_env: dict[str, str],
) -> None:
    sent: list[str] = []

    def send(fence: Any, tenant: str) -> dict[str, str]:
        sent.append(tenant)
        return {"sent": tenant}

    op = _operator(send)
    results = []
    for index in (3, 7):  # the template names the same tenant twice (a duplicate in the list)
        op.op_kwargs = {"tenant": "acme"}
        context = task_context(op, logical_date=NIGHT, map_index=index)
        context["map_index_template"] = "{{ tenant }}"
        if index == 3:
            results.append(op.execute(context))
            continue
        with pytest.raises(AirflowFailException) as failed:
            op.execute(context)
        message = str(failed.value)
        assert "map index 3" in message
        assert "map index 7" in message
        assert "webhooks/send/2024-02-15/acme" in message
    assert sent == ["acme"]
    assert results == [{"sent": "acme"}]
    with LeaseStore(plugin_env["lease"]) as store:
        row = store.get("webhooks/send/2024-02-15/acme")
    assert row is not None
    assert row["holder"]["map_index"] == 3


def test_the_same_tenant_in_another_run_is_handed_the_recorded_result(
    plugin_env: dict[str, str],
) -> None:
    # a second DAG run (or a reordered list after a clear) is not a collision
    calls: list[str] = []

    def send(fence: Any, tenant: str) -> dict[str, str]:
        calls.append(tenant)
        return {"sent": tenant}

    op = _operator(send)
    op.op_kwargs = {"tenant": "acme"}
    got = []
    for run_id, index in (("scheduled__a", 3), ("manual__b", 7)):
        context = task_context(op, run_id=run_id, logical_date=NIGHT, map_index=index)
        context["map_index_template"] = "{{ tenant }}"
        got.append(op.execute(context))
    assert got == [{"sent": "acme"}, {"sent": "acme"}]
    assert calls == ["acme"]


def test_a_tenant_named_like_a_shadow_key_never_shares_a_key_with_the_shadow() -> None:
    """A shadow's lease key is its primary's with ``#shadow`` appended: a tenant whose name
    ends in ``#shadow`` must not key as the shadow of the tenant named without it (its run
    would be handed the shadow's result and never charged, and the comparison would drop it)."""
    from airflow_plugins.lease.keys import SHADOW_SUFFIX, escape_map_key, lease_key

    day = "2024-02-15"
    shadow_of_acme = lease_key("webhooks", "send", day, escape_map_key("acme")).shadow
    named_like_it = str(lease_key("webhooks", "send", day, escape_map_key("acme#shadow")))
    assert named_like_it != shadow_of_acme
    assert not named_like_it.endswith(SHADOW_SUFFIX)
    assert escape_map_key("acme#shadow") != escape_map_key("acme%23shadow")  # still injective
    assert escape_map_key("acme#shadow-eu") == "acme#shadow-eu"  # only the suffix: keys as before
    assert map_key_of("acme#shadow", None) == escape_map_key("acme#shadow")
