"""Key resolution from an Airflow task context: period, timezone, conf, mapped tasks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pendulum
import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from airflow_plugins.lease import InvalidLeaseInput
from airflow_plugins.lease.keys import Period, escape_map_key
from airflow_plugins.protection.task_identity import dag_period, target_from_context
from tests.airflow.conftest import task_context


def _task(schedule: object, *, tz: str = "UTC", tags: list[str] | None = None) -> EmptyOperator:
    with DAG(
        "billing_nightly",
        schedule=schedule,  # type: ignore[arg-type]
        start_date=pendulum.datetime(2024, 1, 1, tz=tz),
        tags=tags or [],
    ):
        return EmptyOperator(task_id="charge")


@pytest.mark.parametrize(
    ("schedule", "period"),
    [
        ("0 2 * * *", Period.DAY),
        ("0 2 * * 1-5", Period.DAY),
        ("@hourly", Period.HOUR),
        ("0 */6 * * *", Period.HOUR),
        ("*/15 * * * *", Period.MINUTE),
        ("@weekly", Period.WEEK),
        ("@monthly", Period.MONTH),
        ("@quarterly", Period.QUARTER),
        ("@yearly", Period.YEAR),
        (timedelta(days=1), Period.DAY),
        (None, Period.DAY),
        ("@once", Period.DAY),
    ],
)
def test_period_comes_from_the_schedule(schedule: object, period: Period) -> None:
    assert dag_period(_task(schedule).dag) is period


def test_a_period_tag_overrides_the_schedule_and_a_bad_one_is_refused() -> None:
    assert dag_period(_task("@hourly", tags=["exactly-once-period:day"]).dag) is Period.DAY
    with pytest.raises(InvalidLeaseInput, match="unknown period"):
        dag_period(_task("@hourly", tags=["exactly-once-period:fortnight"]).dag)


def test_business_date_is_the_logical_date_in_the_dags_timezone() -> None:
    task = _task("0 2 * * *", tz="Europe/Paris")
    # 23:30 UTC on the 14th is 00:30 on the 15th in Paris
    late = task_context(task, logical_date=datetime(2024, 2, 14, 23, 30, tzinfo=UTC))
    assert str(target_from_context(late).key) == "billing_nightly/charge/2024-02-15"
    utc_task = _task("0 2 * * *")
    assert (
        str(
            target_from_context(
                task_context(utc_task, logical_date=late["dag_run"].logical_date)
            ).key
        )
        == "billing_nightly/charge/2024-02-14"
    )


def test_hourly_and_monthly_keys() -> None:
    moment = datetime(2024, 2, 15, 3, 0, tzinfo=UTC)
    hourly = target_from_context(task_context(_task("@hourly"), logical_date=moment))
    assert hourly.business_date == "2024-02-15T03"
    monthly = target_from_context(task_context(_task("@monthly"), logical_date=moment))
    assert monthly.business_date == "2024-02"
    assert monthly.first_day.isoformat() == "2024-02-01"


def test_conf_business_date_wins_and_is_validated() -> None:
    task = _task("0 2 * * *")
    moment = datetime(2024, 2, 15, 2, tzinfo=UTC)
    named = task_context(task, logical_date=moment, conf={"business_date": "2024-02-10"})
    assert target_from_context(named).business_date == "2024-02-10"
    for bad in ("2024-02-30", "15/02/2024", "2024-02", 20240215):
        with pytest.raises(InvalidLeaseInput, match="business_date"):
            target_from_context(
                task_context(task, logical_date=moment, conf={"business_date": bad})
            )


def test_a_manual_run_with_no_date_is_refused_with_a_clear_error() -> None:
    task = _task(None)
    with pytest.raises(InvalidLeaseInput, match=r'no logical date.*"business_date"'):
        target_from_context(task_context(task, run_id="manual__1", logical_date=None))
    manual = task_context(task, logical_date=None, conf={"business_date": "2024-02-15"})
    assert target_from_context(manual).business_date == "2024-02-15"


def test_mapped_tasks_are_keyed_on_the_rendered_template_not_the_position() -> None:
    task = _task("0 2 * * *")
    moment = datetime(2024, 2, 15, 2, tzinfo=UTC)
    first = target_from_context(
        task_context(task, logical_date=moment, map_index=0, rendered_map_index="tenant-42")
    )
    # the list changed: the same tenant is now at position 5; same key
    later = target_from_context(
        task_context(task, logical_date=moment, map_index=5, rendered_map_index="tenant-42")
    )
    assert str(first.key) == str(later.key) == "billing_nightly/charge/2024-02-15/tenant-42"
    assert first.holder.map_index == 0
    assert later.holder.map_index == 5


def test_a_mapped_task_renders_its_template_when_airflow_has_not_yet() -> None:
    task = _task("0 2 * * *")
    context = task_context(task, logical_date=datetime(2024, 2, 15, 2, tzinfo=UTC), map_index=1)
    context["map_index_template"] = "{{ tenant }}"
    context["tenant"] = "acme"
    assert str(target_from_context(context).key).endswith("/2024-02-15/acme")


def test_a_template_over_the_tasks_arguments_renders_before_the_work() -> None:
    task = _task("0 2 * * *")
    task.op_kwargs = {"tenant": "initech"}  # type: ignore[attr-defined]
    context = task_context(task, logical_date=datetime(2024, 2, 15, 2, tzinfo=UTC), map_index=2)
    context["map_index_template"] = "{{ tenant }}"
    assert str(target_from_context(context).key).endswith("/2024-02-15/initech")
    context["map_index_template"] = "{{ set_during_the_work }}"
    with pytest.raises(InvalidLeaseInput, match="cannot be rendered before the work"):
        target_from_context(context)


@pytest.mark.parametrize("value", ["acme", 42, 3.5, None, "a<b>&c", "tenant/7"])
@pytest.mark.parametrize("template", ["{{ tenant }}", "{{tenant}}", "  {{ tenant }}\n"])
@pytest.mark.parametrize("jinja_kwargs", [{}, {"autoescape": True}])
def test_a_one_name_template_keys_as_jinja_renders_it(
    value: object, template: str, jinja_kwargs: dict[str, object]
) -> None:
    # such templates skip compiling Jinja: the key must be what Jinja would have rendered
    with DAG(
        "billing_nightly",
        schedule="0 2 * * *",
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        jinja_environment_kwargs=jinja_kwargs,
    ):
        task = EmptyOperator(task_id="charge")
    task.op_kwargs = {"tenant": value}  # type: ignore[attr-defined]
    context = task_context(task, logical_date=datetime(2024, 2, 15, 2, tzinfo=UTC), map_index=0)
    context["map_index_template"] = template
    rendered = task.dag.get_template_env().from_string(template.strip()).render(tenant=value)
    expected = escape_map_key(rendered)
    assert str(target_from_context(context).key) == f"billing_nightly/charge/2024-02-15/{expected}"


def test_a_mapped_task_without_template_is_refused() -> None:
    task = _task("0 2 * * *")
    context = task_context(task, logical_date=datetime(2024, 2, 15, 2, tzinfo=UTC), map_index=3)
    with pytest.raises(InvalidLeaseInput, match="map_index_template"):
        target_from_context(context)


def test_the_holder_names_the_try() -> None:
    task = _task("0 2 * * *")
    context = task_context(
        task, run_id="r1", logical_date=datetime(2024, 2, 15, 2, tzinfo=UTC), try_number=3
    )
    holder = target_from_context(context).holder
    assert (holder.engine, holder.dag_id, holder.task_id, holder.run_id, holder.try_number) == (
        "airflow",
        "billing_nightly",
        "charge",
        "r1",
        3,
    )


@pytest.mark.parametrize("schedule", ["0 2 * * *", "@hourly", timedelta(hours=6), "@monthly"])
def test_the_scheduler_side_dag_resolves_the_same_period_and_timezone(schedule: object) -> None:
    # the listener sees the serialized DAG, the operator the parsed one: same key either way
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_plugins.protection.task_identity import dag_timezone

    dag = _task(schedule, tz="Europe/Paris").dag
    serialized = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert dag_period(serialized) is dag_period(dag)
    assert dag_timezone(serialized) == dag_timezone(dag) == "Europe/Paris"
