"""What Airflow does around a task, carried into the worker. The Airflow run handed over reaches
its tasks: ``LatestOnlyOperator`` decides from its run type and data interval as in Airflow (a
manual run and the latest interval run downstream, an old interval skips its direct downstream
tasks, the trigger rules after it decide the rest), ``dag_run.conf`` and the params it
overrides are Airflow's; a DAG that reads the Airflow run is refused, before anything runs, in
a run that has none. Pre/post-execute hooks (``run_if``, ``skip_if``, ``pre_execute=``,
``post_execute=``) run around the operator's execute, and generator callables are drained by
it. On the real Temporal dev server with the semantics DAGs (``semantics_dags/``:
``latest_only_cases.py``, ``run_conf.py``, ``execute_hooks.py``, ``generator_tasks.py``)
rebuilt from their folder; ``test_corpus_truth`` compares the same runs with Airflow's.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.in_airflow.translate import translate
from bridge.spec import AirflowRun, DagRunInput, DagRunResult
from bridge.temporal.schedule import NoCronSchedule, schedule_spec
from bridge.worker.catalog import TaskCatalog
from bridge.worker.workflows import DagRunWorkflow
from tests.bridge.conftest import running_worker
from tests.bridge.corpus import dag_bag
from tests.bridge.test_corpus_truth import SEMANTICS, _result_of


@pytest.fixture(scope="module")
def semantics() -> tuple[dict[str, Any], TaskCatalog]:
    catalog = TaskCatalog(str(SEMANTICS))
    catalog.load()  # on the main thread: Airflow's parser uses SIGALRM
    return dag_bag(SEMANTICS), catalog


def _day() -> str:
    return (date.today() - timedelta(days=40 + uuid.uuid4().int % 300)).isoformat()


def _interval(end: datetime) -> AirflowRun:
    """A scheduled @daily run's data interval, ending at ``end``."""
    start = end - timedelta(days=1)
    return AirflowRun("scheduled", {}, start.isoformat(), end.isoformat(), start.isoformat())


def _runs(
    config: BridgeConfig,
    store: LeaseStore,
    catalog: TaskCatalog,
    dag: Any,
    runs: list[AirflowRun | None],
) -> list[DagRunResult | BaseException]:
    spec = translate(dag).spec
    assert spec is not None

    async def scenario() -> list[DagRunResult | BaseException]:
        async with running_worker(config, store, catalog) as client:
            got: list[DagRunResult | BaseException] = []
            for run in runs:
                day = _day()
                wid = f"{dag.dag_id}/{day}/{uuid.uuid4().hex[:6]}"
                await client.start_workflow(
                    DagRunWorkflow.run,
                    DagRunInput(spec, day, source="test", airflow_run=run),
                    id=wid,
                    task_queue=config.task_queue(spec.lane),
                )
                try:  # a failed run's outcome, as the workflow recorded it
                    got.append(await _result_of(client, wid))
                except AssertionError:  # refused before anything ran: nothing recorded
                    try:
                        await client.get_workflow_handle(wid).result()
                    except WorkflowFailureError as exc:
                        got.append(exc)
            return got

    return asyncio.run(scenario())


def _states(result: DagRunResult | BaseException) -> dict[str, str]:
    assert isinstance(result, DagRunResult), result
    return {t: o.status for t, o in result.tasks.items()}


def test_latest_only_decides_from_the_airflow_run_handed_over(
    config: BridgeConfig,
    lease_store: LeaseStore,
    semantics: tuple[dict[str, Any], TaskCatalog],
) -> None:
    bag, catalog = semantics
    dag = bag["latest_only_cases"]
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    manual, latest, old, none = _runs(
        config,
        lease_store,
        catalog,
        dag,
        [
            AirflowRun("manual", {}, None, None, None),
            _interval(today),  # the latest interval: now is before the next one closes
            dataclass_backfill(_interval(today - timedelta(days=30))),
            None,
        ],
    )
    ran = {t: "succeeded" for t in _states(manual)} | {
        "join_all_skipped": "skipped",
        "only_when_not_latest": "skipped",
    }
    assert _states(manual) == ran
    assert _states(latest) == ran
    assert isinstance(latest, DagRunResult)
    assert latest.tasks["report"].result == "ran for a DagRunType.SCHEDULED run"
    assert _states(old) == {
        "latest": "succeeded",
        "gated": "skipped",  # its direct downstream tasks: skipped by the branch
        "report": "skipped",
        "side": "succeeded",
        "after_report": "skipped",
        "join_all_success": "skipped",
        "join_all_done": "succeeded",
        "join_none_failed": "succeeded",
        "join_one_success": "succeeded",
        "join_all_skipped": "skipped",
        "join_none_failed_min_one_success": "succeeded",
        "join_none_skipped": "skipped",
        "only_when_not_latest": "succeeded",
    }
    # without an Airflow run (the CLI, temporal-scheduled) it is refused before anything ran
    assert isinstance(none, WorkflowFailureError)
    assert "latest: latest only, which only a run handed over from Airflow carries" in str(
        none.cause
    )
    spec = translate(dag).spec
    assert spec is not None
    with pytest.raises(NoCronSchedule, match="decide from the Airflow run handed over"):
        schedule_spec(spec)


def dataclass_backfill(run: AirflowRun) -> AirflowRun:
    """The same interval, run by a backfill."""
    import dataclasses

    return dataclasses.replace(run, run_type="backfill")


def test_the_conf_and_params_are_the_airflow_runs(
    config: BridgeConfig,
    lease_store: LeaseStore,
    semantics: tuple[dict[str, Any], TaskCatalog],
) -> None:
    bag, catalog = semantics
    conf = {"business_date": "x", "message": "hi", "count": 3}
    (result,) = _runs(
        config, lease_store, catalog, bag["run_conf"], [AirflowRun("manual", conf, None, None)]
    )
    assert isinstance(result, DagRunResult), result
    outputs = {t: o.result for t, o in result.tasks.items()}
    assert outputs == {
        "templated": "hi none",
        "from_dag_run": {"message": "hi", "keys": ["business_date", "count", "message"]},
        "from_params": "hello x3",  # the conf overrides the DAG's param, as in Airflow
    }


def test_execute_hooks_run_around_the_operators_execute(
    config: BridgeConfig,
    lease_store: LeaseStore,
    semantics: tuple[dict[str, Any], TaskCatalog],
) -> None:
    bag, catalog = semantics
    (result,) = _runs(config, lease_store, catalog, bag["execute_hooks"], [None])
    assert isinstance(result, DagRunResult), result
    assert result.status == "failed"  # post_fails is a leaf
    assert {t: (o.status, o.result) for t, o in result.tasks.items()} == {
        "runs": ("succeeded", "ran"),
        "not_run": ("skipped", None),
        "skipped": ("skipped", None),
        "after_skip": ("skipped", None),
        "after_skip_none_failed": ("succeeded", "none failed"),
        "pre_skips": ("skipped", None),
        "post_passes": ("succeeded", "checked"),
        "post_fails": ("failed", None),
    }
    assert "the post-execute hook rejects 'other'" in str(result.tasks["post_fails"].error)


def test_generator_callables_are_drained_by_their_operator(
    config: BridgeConfig,
    lease_store: LeaseStore,
    semantics: tuple[dict[str, Any], TaskCatalog],
) -> None:
    bag, catalog = semantics
    (result,) = _runs(config, lease_store, catalog, bag["generator_tasks"], [None])
    assert isinstance(result, DagRunResult), result
    assert {t: (o.status, o.result) for t, o in result.tasks.items()} == {
        "with_metadata": ("succeeded", "wrote 3 rows"),  # the generator's return value
        "after": ("succeeded", "WROTE 3 ROWS"),
        "yields_only": ("succeeded", None),
        "fails_part_way": ("failed", None),
    }
    assert "the generator fails on purpose" in str(result.tasks["fails_part_way"].error)
