"""The truth check: every example DAG the inventory calls translatable runs the same in Airflow
and through the bridge.

The corpus is the example DAGs Airflow and its standard / common-sql providers ship, read in
place from the installed packages (``tests.bridge.corpus``). Each DAG is run twice for the same
business date:

* in Airflow: the shared harness (real scheduler with LocalExecutor, dag-processor, api-server on
  Postgres) parses the installed example folders as extra bundles; the test triggers a run per
  DAG through the REST API (logical date = the business date, conf ``{"business_date": ...}``, as
  the bridge gives its tasks) and reads every task instance's state and ``return_value`` XCom
  back through the API;
* through the bridge: ``translate`` makes the spec, the DAG-run workflow runs it on the real
  Temporal dev server with in-process workers whose catalog is the same installed folders, and
  the task outcomes are read from the workflow's history (the ``finish_run`` activity's input,
  written for a failed run too).

It compares, per task, the state (``success`` / ``failed`` / ``upstream_failed`` / ...) and the
XCom value (only the state for the ``VOLATILE`` tasks, whose output differs between any two
runs, in Airflow too), and the run's own state (``success`` / ``failed``, under ``RUN``).
Each bridge run is handed Airflow's run of it (its type, conf and data interval, as the
handover carries them); ``test_latest_only_decides_as_airflow_for_scheduled_and_backfilled_runs``
(``-k latest_only_decides``) adds the runs a trigger cannot make: the latest scheduled one and a
backfilled old interval.
The run's own id is the one thing that differs by design (Airflow's run id cannot hold the
workflow id's ``/``), so it is replaced by ``<run_id>`` on both sides.

Beside the corpus, ``semantics_dags/trigger_rule_matrix.py`` (this project's) has every trigger
rule the workflow decides over each mix of upstream outcomes (and ``sensor_waits.py`` sensors
that fire, time out, soft-fail, skip and defer; ``setup_teardown.py`` setups and teardowns
whose work, setup or teardown fails or skips, in task groups too; ``latest_only_cases.py``
LatestOnlyOperator with the trigger rules after it; ``run_conf.py`` the run's conf and the
params it overrides; ``execute_hooks.py`` pre/post-execute hooks), compared with ``FAST`` (a
few corpus DAGs covering each kind of task the inventory lets through). The whole translatable
share runs with::

    EO_FULL_CORPUS=1 .venv/bin/python -m pytest tests/bridge/test_corpus_truth.py -m extended -s

the fast subset alone with ``-m extended -k fast`` (the module is ``extended``: the README's
test command leaves it out), and some DAGs of the share (with the semantics DAGs) by adding
``EO_CORPUS_DAGS=example_sensor_decorator,example_time_delta_sensor_async``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError

from airflow_plugins.demo.airflow_api import AirflowApiError
from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.identity import workflow_id
from bridge.in_airflow.translate import inventory
from bridge.partition import resolve
from bridge.spec import AirflowRun, DagRunInput, DagRunResult
from bridge.worker.catalog import TaskCatalog
from bridge.worker.workflows import DagRunWorkflow
from tests.bridge.conftest import running_worker
from tests.bridge.corpus import corpus_dags, corpus_folders, dag_bag
from tests.harness.airflow_harness import EXTRA_DAG_FOLDERS, AirflowHarness
from tests.harness.fixtures import airflow  # noqa: F401  (the session fixture)

#: This project's DAGs of the semantics no corpus DAG has (every trigger rule over each mix).
SEMANTICS = Path(__file__).parent / "semantics_dags"
# about 115 example DAGs parsed all session long would load every other scenario's stack: the
# module is "extended" (not in the test command), and its folders join the harness only when
# its tests are collected (tests/conftest.py calls this)


def add_dag_folders() -> None:
    """Has the session's harness parse the installed example folders in place, and ours."""
    EXTRA_DAG_FOLDERS.update(corpus_folders())
    EXTRA_DAG_FOLDERS["bridge_semantics"] = SEMANTICS


pytestmark = pytest.mark.extended

#: A fast subset for CI: Bash with templates, TaskFlow with XComs between tasks, a task group,
#: a failing task, empty operators in a branchy graph, a provider's DAG; the task context and
#: XCom keys (tutorial_dag, example_xcom_args), multiple_outputs (tutorial_taskflow_api), skips
#: and trigger rules (example_skip_dag), branching and short-circuit.
FAST = (
    "tutorial",
    "tutorial_dag",
    "tutorial_taskflow_api",
    "example_xcom_args",
    "example_skip_dag",
    "example_short_circuit_decorator",
    "example_nested_branch_dag",
    "example_task_group_decorator",
    "example_failed_dag",
    "example_branch_labels",
    "example_measurement_correction_decorator",
    "asset_produces_1",
    "example_display_name",
    "ingest_region_stats",  # the asset partition (a runtime one), read from the context
    "aggregate_regional_sales",  # a composite key with a date: partition_date resolved
)
#: The example DAGs whose tasks take Airflow 3.3's state stores (one of them mapped), an
#: ``async def`` callable or ``test_mode`` (``tests/bridge/test_task_context.py`` has their
#: semantics one by one).
CONTEXT = (
    "example_task_state_store",
    "example_task_state_store_async",
    "example_task_state_store_mapped",
    "example_asset_state_store_producer",
    "example_asset_state_store_consumer",
    "example_passing_params_via_test_command",
)
#: Task outputs that differ between any two runs, in Airflow too: their state is compared, their
#: value is not (by task, with the reason).
VOLATILE = {
    "tutorial.print_date": "prints the wall clock (`date`)",
    "example_bash_operator.describe_dag_folder": "prints the deployment's $AIRFLOW_HOME",
    "example_bash_operator.show_dag_folder_stats": "prints the deployment's $AIRFLOW_HOME",
    "example_bash_decorator.describe_dag_folder": "prints the deployment's $AIRFLOW_HOME",
    "example_bash_decorator.show_dag_folder_stats": "prints the deployment's $AIRFLOW_HOME",
    "example_sensors.print_date_in_bash": "prints the wall clock (`date`)",
    "example_task_state_store.run_job": "returns a random row count (random.randint)",
    "example_asset_state_store_producer.load": "returns a random record count (random.randint)",
    "example_task_state_store_mapped.process_table": "returns a random row count and the time",
}
#: Tasks whose XCom is a list made from a set: LatestOnlyOperator returns its downstream task ids
#: in a set's order, which Python's per-process string hash seed decides, in Airflow too; compared
#: sorted (a DAG id's ``[run]`` suffix, a run of the latest-only check, is left out).
UNORDERED = {"latest_only_cases.latest"}
#: DAGs whose branch task picks its branch at random (``random.choice``), in Airflow too: the
#: tasks named for each option (``branch_a`` .. ``venv_d``) are compared as one group, their
#: states and XComs as a multiset with the option letter left out (one chosen, the rest skipped).
CHOSEN_AT_RANDOM = {
    "example_branch_operator": ("a", "b", "c", "d"),
    "example_branch_python_operator_decorator": ("a", "b", "c", "d"),
}
#: Translatable DAGs this Airflow stack cannot load, by name with the reason (not compared).
AIRFLOW_CANNOT_LOAD = {
    "example_custom_weight": "its priority-weight strategy comes from the example plugin, "
    "which this stack does not install (an import error in Airflow)",
    "example_workday_timetable": "its timetable comes from the example plugin, which this stack "
    "does not install (an import error in Airflow)",
}
#: The partition each partitioned DAG is run for, in both engines (its key for business date
#: ``{day}``, in the form its timetable's mappers accept). Triggered by hand through the REST API
#: with this ``partition_key``: Airflow 3.3 accepts a key for any partitioned DAG, asset-scheduled
#: ones too (``validate_partition_key`` checks only that the timetable is partitioned, and
#: ``resolve_partition_date`` that the key has the mappers' form).
PARTITIONS = {
    "ingest_region_stats": "us",  # PartitionedAtRuntime: any key, no date
    "aggregate_regional_sales": "eu|{day}",  # ProductMapper(Identity, StartOfDay)
    "clean_and_combine_player_stats": "{day}T03",  # StartOfHourMapper
    "daily_team_a_rollup": "{day}",  # RollupMapper(StartOfDay, DayWindow)
    "monthly_team_a_rollup": "{month}",  # RollupMapper(StartOfMonth, MonthWindow)
    "daily_inference": "{day}",  # FanOutMapper(StartOfWeek, WeekWindow): daily keys
    "trailing_week_inference": "{day}",
    "segment_region_stats_rollup": "all_regions",  # FixedKeyMapper
    "segment_region_stats_early_rollup": "all_regions",
    "summarize_live_region_stats": "apac",  # IdentityMapper
    "scatter_live_region_to_segments": "us",  # FanOutMapper(Identity, SegmentWindow, Identity)
    "partition_context": "{day}",  # this project's: every way a task reads the partition
    "partition_regions": "eu",  # this project's: a region (no date)
}
#: The conf each DAG is triggered with beyond the business date (the same in both engines: the
#: handover carries the Airflow run's conf, ``bridge.spec.AirflowRun``).
CONF = {
    "example_trigger_target_dag": {"message": "from the corpus check"},
    "run_conf": {"message": "from the trigger", "count": 3},  # overrides a param
    "example_params_ui_tutorial": {"required_field": "given by the corpus check"},
}
#: Translatable DAGs whose run takes longer than a check can wait, by name with the reason.
TOO_SLOW = {
    "example_sensors": "its deferrable TimeSensor (timeout=1, soft_fail) waits an hour for a "
    "target time an hour ahead, in Airflow too: a deferral without a timeout of its own is not "
    "bounded by the sensor's timeout",
}
_STATES = {"succeeded": "success"}  # the bridge's outcome names -> Airflow's task states
#: The key the run's own state is compared under (no task id has parentheses).
RUN = "(run)"
RUN_TIMEOUT_S = 600.0


def translatable() -> dict[str, Any]:
    """The corpus DAGs the inventory calls translatable and Airflow loads, by DAG id."""
    dags = corpus_dags()
    found = inventory(dags.values())
    left_out = {**AIRFLOW_CANNOT_LOAD, **TOO_SLOW}
    return {t.dag_id: dags[t.dag_id] for t in found if t.ok and t.dag_id not in left_out}


def partition_of(dag_id: str, day: str) -> str | None:
    """The partition key ``dag_id`` is run for on ``day`` (None: not a partitioned run)."""
    template = PARTITIONS.get(dag_id)
    return template.format(day=day, month=day[:7]) if template is not None else None


def _normal(value: Any, run_id: str) -> Any:
    """A value as JSON, with the run's own id replaced (the one difference by design)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return json.loads(text.replace(run_id, "<run_id>")) if run_id else json.loads(text)


Seen = dict[str, tuple[str, Any]]  # task id -> (state, XCom return value)


def in_airflow(
    harness: AirflowHarness, dag_ids: Iterable[str], day: str
) -> tuple[dict[str, Seen], dict[str, AirflowRun]]:
    """Triggers one run per DAG for business date ``day``; returns what Airflow did, and each
    DAG's run as the handover carries it (``bridge.in_airflow.handoff.airflow_run``)."""
    api = harness.client()
    logical = datetime.fromisoformat(day).replace(tzinfo=UTC)
    runs = {
        dag_id: harness.trigger_dag_run(
            dag_id,
            {"business_date": day, **CONF.get(dag_id, {})},
            logical,
            run_id=f"corpus__{day}__{uuid.uuid4().hex[:6]}",
            partition_key=partition_of(dag_id, day),
        )
        for dag_id in dag_ids
    }
    seen: dict[str, Seen] = {}
    handed: dict[str, AirflowRun] = {}
    for dag_id, run_id in runs.items():
        run = harness.wait_for_run_state(dag_id, run_id, timeout=RUN_TIMEOUT_S)
        assert run.get("partition_key") == partition_of(dag_id, day), run
        handed[dag_id] = carried(run)
        seen[dag_id] = seen_in_airflow(api, dag_id, run_id, run)
    return seen, handed


def seen_in_airflow(api: Any, dag_id: str, run_id: str, run: dict[str, Any]) -> Seen:
    """What one finished Airflow run did: each task's state and XCom, and the run's state."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for ti in api.task_instances(dag_id, run_id):
        by_task.setdefault(ti["task_id"], []).append(ti)
    tasks: Seen = {RUN: (str(run["state"]), None)}
    for task_id, tis in by_task.items():
        tis.sort(key=lambda ti: int(ti.get("map_index", -1)))
        states = {str(ti["state"]) for ti in tis}
        state = states.pop() if len(states) == 1 else "failed"
        values = [_return_value(api, dag_id, run_id, ti) for ti in tis]
        if int(tis[0].get("map_index", -1)) >= 0:
            # a mapped task: what Airflow hands on, its items' XComs in map index order
            value: Any = [v for v in values if v is not None]
        else:
            value = values[0]
        tasks[task_id] = (state, _normal(value, run_id))
    return tasks


def carried(run: dict[str, Any]) -> AirflowRun:
    """An Airflow run (the REST API's) as the handover carries it."""
    return AirflowRun(
        run_type=str(run["run_type"]),
        conf=dict(run.get("conf") or {}),
        data_interval_start=run.get("data_interval_start"),
        data_interval_end=run.get("data_interval_end"),
        logical_date=run.get("logical_date"),
    )


def _return_value(api: Any, dag_id: str, run_id: str, ti: dict[str, Any]) -> Any:
    """A task instance's ``return_value`` XCom (None: it pushed none)."""
    try:
        entry = api.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}"
            "/xcomEntries/return_value",
            # the stored value: the API's ``deserialize`` JSON-decodes a stored string once
            # more (a task's "1" reads back as 1)
            params={
                "deserialize": "false",
                "stringify": "false",
                "map_index": int(ti.get("map_index", -1)),
            },
        )
    except AirflowApiError as exc:
        if "404" not in str(exc):
            raise
        return None
    return entry["value"]


async def _result_of(client: Client, wid: str) -> DagRunResult:
    """The run's outcome as the workflow recorded it (the ``finish_run`` activity's input)."""
    handle = client.get_workflow_handle(wid)
    with_failure = None
    try:
        await handle.result()
    except WorkflowFailureError as exc:  # a failed task fails the run after recording it
        with_failure = exc
    history = await handle.fetch_history()
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        scheduled = event.activity_task_scheduled_event_attributes
        if scheduled.activity_type.name == "bridge.finish_run":
            (result,) = await client.data_converter.decode(scheduled.input.payloads, [DagRunResult])
            assert isinstance(result, DagRunResult)
            return result
    raise AssertionError(f"{wid} recorded no result: {with_failure}")


def in_bridge(
    config: BridgeConfig,
    store: LeaseStore,
    dags: dict[str, Any],
    day: str,
    handed: dict[str, AirflowRun],
) -> dict[str, Seen]:
    """Runs every DAG's translation as one DAG-run workflow each, handed over with Airflow's
    run of it (``handed``); returns what they did."""
    from bridge.in_airflow.translate import translate

    folders = os.pathsep.join(str(f) for f in [*corpus_folders().values(), SEMANTICS])
    catalog = TaskCatalog(folders)
    catalog.load()  # on the main thread (Airflow's parser times imports out with SIGALRM)

    async def scenario() -> dict[str, Seen]:
        async with running_worker(config, store, catalog) as client:
            ids: dict[str, str] = {}
            for dag_id, dag in dags.items():
                spec = translate(dag).spec
                assert spec is not None, dag_id
                key = partition_of(dag_id, day)
                resolved = resolve(dag, key)  # as the handover resolves it
                wid = workflow_id(dag_id, day, partition_key=key)
                await client.start_workflow(
                    DagRunWorkflow.run,
                    DagRunInput(
                        spec,
                        day,
                        source="corpus",
                        partition_key=key,
                        partition_date=resolved.isoformat() if resolved else None,
                        airflow_run=handed[dag_id],
                    ),
                    id=wid,
                    task_queue=config.task_queue(spec.lane),
                )
                ids[dag_id] = wid
            results = await asyncio.gather(*(_result_of(client, w) for w in ids.values()))
        return {
            dag_id: {
                RUN: (result.status, None),
                **{
                    t: (_STATES.get(o.status, o.status), _normal(o.result, ids[dag_id]))
                    for t, o in result.tasks.items()
                },
            }
            for dag_id, result in zip(ids, results, strict=True)
        }

    return asyncio.run(scenario())


def _by_choice(tasks: Seen, options: tuple[str, ...]) -> dict[str, Any]:
    """A randomly branching DAG's outcome with the option letters left out: the tasks named
    ``<name>_<option>`` become one group ``<name>_*`` of sorted (state, XCom) pairs."""
    letter = re.compile(rf"_({'|'.join(map(re.escape, options))})\b")
    groups: dict[str, list[Any]] = {}
    for task_id, (state, value) in tasks.items():
        value = json.loads(letter.sub("_*", json.dumps(value)))
        groups.setdefault(letter.sub("_*", task_id), []).append((state, value))
    return {k: sorted(v, key=json.dumps) for k, v in groups.items()}


def _sorted(seen: tuple[str, Any] | None) -> tuple[str, Any] | None:
    if seen is None or not isinstance(seen[1], list):
        return seen
    return seen[0], sorted(seen[1], key=json.dumps)


def compare(airflow_side: dict[str, Seen], bridge_side: dict[str, Seen]) -> list[str]:
    """Every task whose state or XCom differs, as ``dag.task: airflow ... bridge ...``."""
    differences: list[str] = []
    for dag_id, tasks in sorted(airflow_side.items()):
        theirs = bridge_side.get(dag_id, {})
        options = CHOSEN_AT_RANDOM.get(dag_id)
        if options is not None:
            tasks, theirs = _by_choice(tasks, options), _by_choice(theirs, options)
        for task_id in sorted(set(tasks) | set(theirs)):
            a, b = tasks.get(task_id), theirs.get(task_id)
            if f"{dag_id}.{task_id}" in VOLATILE and a and b:
                a, b = a[0], b[0]
            if f"{dag_id.split('[', 1)[0]}.{task_id}" in UNORDERED:
                a, b = _sorted(a), _sorted(b)
            if a != b:
                differences.append(f"{dag_id}.{task_id}: airflow {a!r}, bridge {b!r}")
    return differences


def _check(
    harness: AirflowHarness,
    config: BridgeConfig,
    store: LeaseStore,
    dags: dict[str, Any],
) -> None:
    day = (date.today() - timedelta(days=40 + uuid.uuid4().int % 200)).isoformat()
    airflow_side, handed = in_airflow(harness, dags, day)
    bridge_side = in_bridge(config, store, dags, day, handed)
    tasks = sum(len(t) - 1 for t in airflow_side.values())  # less the run's own state
    differences = compare(airflow_side, bridge_side)
    same = len(dags) - len({d.split(".", 1)[0] for d in differences})
    print(f"\ncorpus comparison: {same}/{len(dags)} DAGs identical ({tasks} tasks)")
    for line in differences:
        print(f"  {line}")
    assert not differences, "\n".join(differences)
    assert tasks >= len(dags)  # every DAG ran at least one task in Airflow


def test_fast_subset_of_the_corpus_runs_the_same_in_airflow_and_the_bridge(
    airflow: AirflowHarness,  # noqa: F811
    config: BridgeConfig,
    lease_store: LeaseStore,
) -> None:
    dags = translatable()
    missing = [d for d in FAST if d not in dags]
    assert not missing, f"the inventory no longer calls these translatable: {missing}"
    _check(airflow, config, lease_store, {**{d: dags[d] for d in FAST}, **dag_bag(SEMANTICS)})


def test_the_context_examples_run_the_same_in_airflow_and_the_bridge(
    airflow: AirflowHarness,  # noqa: F811
    config: BridgeConfig,
    lease_store: LeaseStore,
) -> None:
    dags = translatable()
    missing = [d for d in CONTEXT if d not in dags]
    assert not missing, f"the inventory no longer calls these translatable: {missing}"
    _check(airflow, config, lease_store, {d: dags[d] for d in CONTEXT})


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_whole_translatable_share_runs_the_same_in_airflow_and_the_bridge(
    airflow: AirflowHarness,  # noqa: F811
    config: BridgeConfig,
    lease_store: LeaseStore,
) -> None:
    if os.environ.get("EO_FULL_CORPUS") != "1":
        pytest.skip("the whole corpus takes minutes: EO_FULL_CORPUS=1 runs it (module docstring)")
    dags = translatable()
    chosen = [d for d in os.environ.get("EO_CORPUS_DAGS", "").split(",") if d]
    if chosen:  # some DAGs of the share only
        assert not set(chosen) - set(dags), f"not in the translatable share: {chosen}"
        dags = {d: dags[d] for d in chosen}
    _check(airflow, config, lease_store, {**dags, **dag_bag(SEMANTICS)})


#: The semantics DAG whose LatestOnlyOperator is run for a scheduled and a backfilled run.
LATEST_ONLY = "latest_only_cases"


def _runs_of(api: Any, dag_id: str, run_type: str) -> list[dict[str, Any]]:
    body = api.request(
        "GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"run_type": run_type, "limit": 100}
    )
    runs: list[dict[str, Any]] = body["dag_runs"]
    return runs


def _run_for(
    api: Any, dag_id: str, run_type: str, days: Iterable[date], timeout: float = 180.0
) -> Any:
    """The run of ``run_type`` whose logical date is one of ``days``, once the scheduler made
    it."""
    wanted = tuple(d.isoformat() for d in days)
    deadline = time.monotonic() + timeout
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = _runs_of(api, dag_id, run_type)
        for run in runs:
            if str(run.get("logical_date") or "").startswith(wanted):
                return run
        time.sleep(2.0)
    raise AssertionError(f"no {run_type} run of {dag_id} on {wanted} after {timeout:.0f}s: {runs}")


def test_latest_only_decides_as_airflow_for_scheduled_and_backfilled_runs(
    airflow: AirflowHarness,  # noqa: F811
    config: BridgeConfig,
    lease_store: LeaseStore,
) -> None:
    """The runs a manual trigger cannot make: the latest scheduled run (its downstream runs)
    and a backfilled old interval (not the latest: its direct downstream tasks are skipped, the
    trigger rules after them decide the rest), each handed over with Airflow's run of it; the
    manual run is in the other checks (every semantics DAG is)."""
    api = airflow.client()
    airflow.wait_for_dag(LATEST_ONLY)
    api.set_paused(LATEST_ONLY, False)  # catchup=False: the scheduler runs the latest interval
    old = date.today() - timedelta(days=300 + uuid.uuid4().int % 600)
    at = datetime(old.year, old.month, old.day, tzinfo=UTC).isoformat()
    api.request(
        "POST",
        "/api/v2/backfills",
        json={"dag_id": LATEST_ONLY, "from_date": at, "to_date": at, "max_active_runs": 1},
    )
    today = datetime.now(UTC).date()
    runs = {  # @daily: the latest run is today's (a cron trigger) or yesterday's (an interval)
        "scheduled": _run_for(api, LATEST_ONLY, "scheduled", (today, today - timedelta(days=1))),
        "backfill": _run_for(api, LATEST_ONLY, "backfill", (old,)),
    }
    airflow_side: dict[str, Seen] = {}
    bridge_side: dict[str, Seen] = {}
    dag = dag_bag(SEMANTICS)[LATEST_ONLY]
    for kind, run in runs.items():
        run = airflow.wait_for_run_state(LATEST_ONLY, run["dag_run_id"], timeout=RUN_TIMEOUT_S)
        name = f"{LATEST_ONLY}[{kind}]"
        airflow_side[name] = seen_in_airflow(api, LATEST_ONLY, run["dag_run_id"], run)
        # a business date of its own: the decision is the carried run's, not the date's
        day = (date.today() - timedelta(days=40 + uuid.uuid4().int % 200)).isoformat()
        got = in_bridge(config, lease_store, {LATEST_ONLY: dag}, day, {LATEST_ONLY: carried(run)})
        bridge_side[name] = got[LATEST_ONLY]
    backfilled = airflow_side[f"{LATEST_ONLY}[backfill]"]
    skipped = {t for t, (state, _) in backfilled.items() if state == "skipped"}
    assert {"gated", "report", "after_report"} <= skipped, airflow_side  # not the latest
    assert airflow_side[f"{LATEST_ONLY}[scheduled]"]["gated"][0] == "success", airflow_side
    differences = compare(airflow_side, bridge_side)
    print(f"\nlatest only: scheduled and backfill runs, {len(differences)} differences")
    for line in differences:
        print(f"  {line}")
    assert not differences, "\n".join(differences)
