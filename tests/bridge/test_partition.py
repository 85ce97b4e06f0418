"""A partitioned Airflow run is a bridge run of its own: its ids and keys name the partition,
its worker context holds it as Airflow's does, and a key its timetable rejects is refused before
anything runs. The DAGs are the partition examples Airflow 3.3 ships (read, not run: no
Airflow component, no Temporal server).
"""

from __future__ import annotations

import pytest
from airflow.providers.standard.operators.bash import BashOperator

from bridge.identity import run_key, task_lease_key, workflow_id
from bridge.in_airflow.translate import translate
from bridge.partition import InvalidPartition, check_partition, resolve
from bridge.spec import RunMode
from bridge.worker.execution import business_run, template_context
from tests.bridge.corpus import corpus_dags

DAY = "2026-06-14"


@pytest.fixture(scope="module")
def dags() -> dict[str, object]:
    return corpus_dags()


def test_two_partitions_of_one_business_date_are_two_runs_and_no_partition_keys_as_before() -> None:
    ids = {workflow_id("ingest_region_stats", DAY, partition_key=r) for r in ("us", "eu", "apac")}
    assert ids == {
        "dagrun:ingest_region_stats/dagrun/2026-06-14@us",
        "dagrun:ingest_region_stats/dagrun/2026-06-14@eu",
        "dagrun:ingest_region_stats/dagrun/2026-06-14@apac",
    }
    # no partition: exactly the ids and keys of before (stored histories depend on them)
    assert workflow_id("billing", DAY) == "dagrun:billing/dagrun/2026-06-14"
    assert workflow_id("billing", DAY, RunMode.SHADOW) == "dagrun:billing/dagrun/2026-06-14#shadow"
    assert str(run_key("billing", DAY)) == "billing/dagrun/2026-06-14"
    assert task_lease_key("b", "charge", DAY, "t-1", RunMode.PRIMARY) == "b/charge/2026-06-14/t-1"
    # a protected task's lease and the run key carry the partition too
    assert (
        task_lease_key("b", "charge", DAY, None, RunMode.SHADOW, "us")
        == "b/charge/2026-06-14@us#shadow"
    )
    assert (
        str(run_key("b", DAY, "us|2026-06-14T03:00:00"))
        == "b/dagrun/2026-06-14@us|2026-06-14T03:00:00"
    )


def test_a_partition_key_cannot_break_the_key_it_is_part_of() -> None:
    slash = workflow_id("d", DAY, partition_key="us/east")
    assert slash == "dagrun:d/dagrun/2026-06-14@us%2Feast"
    assert workflow_id("d", DAY, partition_key="us%2Feast") != slash
    # a key ending in #shadow does not read as the shadow of another partition
    tricky = workflow_id("d", DAY, partition_key="us#shadow")
    assert tricky != workflow_id("d", DAY, RunMode.SHADOW, partition_key="us")


def test_airflow_resolves_the_partition_date_and_a_rejected_key_is_refused(
    dags: dict[str, object],
) -> None:
    assert resolve(dags["daily_inference"], "2024-01-03").isoformat() == (  # type: ignore[union-attr]
        "2024-01-03T00:00:00+00:00"
    )
    assert resolve(dags["ingest_region_stats"], "us") is None  # a runtime partition: no date
    with pytest.raises(InvalidPartition, match="'bogus' is refused by its timetable"):
        resolve(dags["daily_inference"], "bogus")
    with pytest.raises(InvalidPartition, match="not a partitioned DAG"):
        resolve(dags["tutorial"], "us")
    with pytest.raises(InvalidPartition, match="non-empty"):
        resolve(dags["ingest_region_stats"], "  ")


def test_a_handover_refuses_a_partition_key_for_a_dag_that_is_not_partitioned(
    dags: dict[str, object],
) -> None:
    partitioned = translate(dags["ingest_region_stats"]).spec  # type: ignore[arg-type]
    plain = translate(dags["tutorial"]).spec  # type: ignore[arg-type]
    assert partitioned is not None
    assert plain is not None
    check_partition(partitioned, "us")
    check_partition(plain, None)
    with pytest.raises(InvalidPartition, match="tutorial is not a partitioned DAG"):
        check_partition(plain, "us")


def test_the_worker_context_holds_the_partition_as_airflow_does(dags: dict[str, object]) -> None:
    dag = dags["daily_inference"]
    run, ds = business_run(
        "daily_inference",
        "dagrun:daily_inference/dagrun/2024-01-03@2024-01-03",
        "2024-01-03",
        period="day",
        timezone="UTC",
        partition_key="2024-01-03",
        partition_date="2024-01-03T00:00:00+00:00",
    )
    op = BashOperator(
        task_id="show",
        bash_command="{{ partition_key }} {{ partition_date }} {{ dag_run.partition_key }}",
        dag=dag,  # type: ignore[arg-type]
    )
    context = template_context(op, run=run, try_number=1, upstream={}, ds=ds)
    assert context["partition_key"] == context["dag_run"].partition_key == "2024-01-03"
    assert context["partition_date"] == context["dag_run"].partition_date
    assert context["partition_date"].isoformat() == "2024-01-03T00:00:00+00:00"
    op.render_template_fields(context)  # type: ignore[arg-type]
    assert op.bash_command == "2024-01-03 2024-01-03 00:00:00+00:00 2024-01-03"
    # a run without a partition: None, as Airflow's context holds for one
    plain, ds = business_run("d", "r", "2024-01-03", period="day", timezone="UTC")
    context = template_context(op, run=plain, try_number=1, upstream={}, ds=ds)
    assert context["partition_key"] is None
    assert context["dag_run"].partition_date is None


def test_the_partition_examples_translate(dags: dict[str, object]) -> None:
    for dag_id in ("ingest_region_stats", "aggregate_regional_sales", "daily_inference"):
        translation = translate(dags[dag_id])  # type: ignore[arg-type]
        assert translation.ok, translation.report()


def test_airflow_keys_a_protected_task_of_a_partition_as_the_bridge_does(
    dags: dict[str, object],
) -> None:
    from datetime import UTC, datetime

    from airflow_plugins.protection.task_identity import target_from_context
    from bridge.in_airflow.handoff import run_partition
    from tests.airflow.conftest import task_context

    dag = dags["daily_inference"]
    task = dag.get_task("run_inference")  # type: ignore[attr-defined]
    context = task_context(task, logical_date=datetime(2024, 1, 3, 2, tzinfo=UTC))
    plain = target_from_context(context)
    assert str(plain.key) == "daily_inference/run_inference/2024-01-03"  # as before
    context["dag_run"].partition_key = "2024-01-03"
    target = target_from_context(context)
    assert str(target.key) == task_lease_key(
        "daily_inference", "run_inference", "2024-01-03", None, RunMode.PRIMARY, "2024-01-03"
    )
    assert target.business_date == "2024-01-03"  # the fence's business date: no partition
    assert str(target.first_day) == "2024-01-03"
    # what the handover passes on: the key and the date Airflow resolves from it
    assert run_partition(context) == ("2024-01-03", "2024-01-03T00:00:00+00:00")
    context["dag_run"].partition_key = "Wednesday"
    with pytest.raises(InvalidPartition, match="'Wednesday' is refused"):
        run_partition(context)


def test_an_asset_triggered_partition_run_is_dated_by_its_partition(
    dags: dict[str, object],
) -> None:
    from datetime import UTC, datetime

    from airflow_plugins.lease import InvalidLeaseInput
    from airflow_plugins.protection.task_identity import target_from_context
    from tests.airflow.conftest import task_context

    # Airflow 3.3 creates an asset-triggered run with no logical date; its partition's date
    # (resolved from the key) is the moment its business date is cut from
    task = dags["daily_inference"].get_task("run_inference")  # type: ignore[attr-defined]
    context = task_context(task, logical_date=None)
    context["dag_run"].partition_key = "2024-01-03"
    context["dag_run"].partition_date = datetime(2024, 1, 3, tzinfo=UTC)
    assert (
        str(target_from_context(context).key)
        == "daily_inference/run_inference/2024-01-03@2024-01-03"
    )
    # a runtime partition (a region) has no date: the run must still name its business date
    context["dag_run"].partition_key, context["dag_run"].partition_date = "us", None
    with pytest.raises(InvalidLeaseInput, match="no logical date"):
        target_from_context(context)
    context["dag_run"].conf = {"business_date": "2024-01-05"}
    assert str(target_from_context(context).key) == "daily_inference/run_inference/2024-01-05@us"


def test_an_empty_partition_key_is_no_partition_in_the_plugins_keys() -> None:
    """Airflow's runs without a partition may carry an empty key: their keys stay the date's."""
    from airflow_plugins.lease.keys import partitioned_date

    assert partitioned_date("2024-02-15", "") == "2024-02-15"
    assert partitioned_date("2024-02-15", None) == "2024-02-15"
    assert partitioned_date("2024-02-15", "us") == "2024-02-15@us"
