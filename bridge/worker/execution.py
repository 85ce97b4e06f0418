"""An Airflow operator's ``execute(context)``, run unchanged inside a bridge activity.

The worker rebuilds the operator from its parsed DAG folder (a fresh copy per call: rendering
mutates the operator), gives it the context such operators read (``template_context``, which
says how it differs from Airflow's), renders its templated fields with the task SDK's own
``render_template_fields``, and calls ``execute`` the way the task runner does (inside the
``ExecutorSafeguard`` tracker). Its return value is the task's output. A virtualenv /
external-python operator's process gets a supervisor socket to reconnect to
(``supervisor_channel``), as under Airflow's supervisor.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, SupportsIndex, cast

if TYPE_CHECKING:
    from airflow.sdk.definitions.context import Context

    from bridge.spec import AirflowRun

#: The spec kwarg holding ``{upstream_task_id: upstream marker}`` for an operator's XCom pulls.
XCOM_ARGUMENT = "$xcom"
RETURN_KEY = "return_value"
#: The base of the operators that run their callable in another interpreter's process.
_OWN_ENVIRONMENT = "_BasePythonVirtualenvOperator"
_PERIOD_STEP: dict[str, dict[str, int]] = {
    "minute": {"minutes": 1},
    "hour": {"hours": 1},
    "day": {"days": 1},
    "week": {"weeks": 1},
    "month": {"months": 1},
    "quarter": {"months": 3},
    "year": {"years": 1},
}


class XComNotCarried(LookupError):
    """An operator asked for an XCom the bridge does not carry between tasks."""


@dataclasses.dataclass(frozen=True)
class WorkerDagRun:
    """The ``dag_run`` an operator sees in a worker: one business run of its DAG."""

    dag_id: str
    run_id: str
    logical_date: datetime
    data_interval_start: datetime
    data_interval_end: datetime
    conf: dict[str, Any]
    #: Airflow's ``DagRunType`` of the run handed over; ``bridge`` for a run with none
    run_type: Any = "bridge"
    partition_key: str | None = None
    #: the partition's date as Airflow resolves it from the key (None: no key, or no date)
    partition_date: datetime | None = None

    @property
    def run_after(self) -> datetime:
        """When the run was due (its logical date)."""
        return self.logical_date


class WorkerTaskInstance:
    """The ``ti`` an operator sees in a worker.

    Args:
        task: the rebuilt operator.
        run_id: the run id (the workflow id).
        try_number: the activity attempt.
        upstream: the return values of the task's upstream tasks, by task id.
        upstream_xcoms: the other XComs they pushed, by task id and key.
    """

    def __init__(
        self,
        task: Any,
        run_id: str,
        try_number: int,
        upstream: Mapping[str, Any],
        upstream_xcoms: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.task = task
        self.dag_id: str = task.dag_id
        self.task_id: str = task.task_id
        self.run_id = run_id
        self.try_number = try_number
        self.map_index = -1
        self.pushed: dict[str, Any] = {}
        self._upstream = dict(upstream)
        self._xcoms = {t: dict(x) for t, x in (upstream_xcoms or {}).items()}
        # read by XComArg.resolve: nothing upstream is mapped, pull unmapped values
        self._upstream_map_indexes: dict[str, Any] = {}
        # read by ResumableJobMixin (a multi-team deployment's team name): none here
        self.stats_tags: dict[str, str] = {}

    def xcom_pull(
        self,
        task_ids: str | Iterable[str] | None = None,
        dag_id: str | None = None,
        key: str = RETURN_KEY,
        include_prior_dates: bool = False,
        *,
        map_indexes: Any = None,
        default: Any = None,
        run_id: str | None = None,
    ) -> Any:
        """An XCom of this task or an upstream one (a list of them for several task ids).

        Raises:
            XComNotCarried: another DAG or run.
        """
        if (dag_id not in (None, self.dag_id)) or (run_id not in (None, self.run_id)):
            raise XComNotCarried("the bridge carries XComs within one run of one DAG only")
        if task_ids is None or isinstance(task_ids, str):
            return self._one(task_ids or self.task_id, key, default)
        return [self._one(t, key, default) for t in task_ids]

    def _one(self, task_id: str, key: str, default: Any) -> Any:
        if task_id == self.task_id:
            return self.pushed.get(key, default)
        if key != RETURN_KEY:
            return self._xcoms.get(task_id, {}).get(key, default)
        return self._upstream.get(task_id, default)

    def xcom_push(self, key: str, value: Any) -> None:
        """Pushes an XCom: the activity hands it to the downstream tasks with its result."""
        self.pushed[key] = value


def business_run(
    dag_id: str,
    run_id: str,
    business_date: str,
    *,
    period: str,
    timezone: str,
    partition_key: str | None = None,
    partition_date: str | None = None,
    airflow_run: AirflowRun | None = None,
) -> tuple[WorkerDagRun, str]:
    """The run an operator sees for a business date, and its ``ds`` (the period's first day).

    A partitioned run's ``dag_run`` carries its ``partition_key`` and ``partition_date`` (ISO
    text, as the run's input holds it) as Airflow's does. A run handed over from an Airflow run
    (``airflow_run``) has that run's type and conf, and its data interval when it has one
    (``LatestOnlyOperator`` decides from them); without one, type ``bridge``, conf
    ``{"business_date": ...}`` and the business period.

    Raises:
        ValueError: a business date that does not fit the period.
    """
    import pendulum

    from airflow_plugins.lease.keys import first_day

    day = first_day(business_date)
    hour, minute = 0, 0
    if "T" in business_date:
        clock = business_date.split("T", 1)[1].split(":")
        hour, minute = int(clock[0]), int(clock[1]) if len(clock) > 1 else 0
    start = pendulum.datetime(day.year, day.month, day.day, hour, minute, tz=timezone)
    step = _PERIOD_STEP[period]
    end = start.add(**step)
    interval: tuple[datetime, datetime] = (start.in_tz("UTC"), end.in_tz("UTC"))
    if airflow_run and airflow_run.data_interval_start and airflow_run.data_interval_end:
        interval = (_utc(airflow_run.data_interval_start), _utc(airflow_run.data_interval_end))
    run = WorkerDagRun(
        dag_id=dag_id,
        run_id=run_id,
        logical_date=start.in_tz("UTC"),
        data_interval_start=interval[0],
        data_interval_end=interval[1],
        conf=dict(airflow_run.conf) if airflow_run else {"business_date": business_date},
        run_type=_run_type(airflow_run.run_type) if airflow_run else "bridge",
        partition_key=partition_key,
        partition_date=(
            pendulum.parse(partition_date).in_tz("UTC")  # type: ignore[union-attr]
            if partition_date
            else None
        ),
    )
    return run, day.isoformat()


def _run_type(value: str) -> Any:
    """Airflow's run type as its task SDK's ``dag_run`` holds it (its enum: a task formatting
    it sees ``DagRunType.MANUAL``, as in Airflow)."""
    from airflow.sdk.api.datamodels._generated import DagRunType

    try:
        return DagRunType(value)
    except ValueError:  # a type this SDK does not know: the text
        return value


def _utc(text: str) -> datetime:
    import pendulum

    return pendulum.parse(text).in_tz("UTC")  # type: ignore[union-attr,no-any-return]


def template_context(
    task: Any,
    *,
    run: WorkerDagRun,
    try_number: int,
    upstream: Mapping[str, Any],
    ds: str,
    upstream_xcoms: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The context an operator's templates and ``execute`` read.

    How it differs from Airflow's:

    - ``logical_date`` / ``data_interval_start`` are the start of the business period in the
      DAG's timezone (UTC-converted), ``data_interval_end`` the start of the next one; ``ds``
      is the business period's first day, so ``{{ ds }}`` renders the business date, not a
      cron time.
    - ``run_id`` is the Temporal workflow id; ``dag_run.conf`` and ``dag_run.run_type`` are the
      Airflow run's it was handed over from (``{"business_date": ...}`` and ``bridge`` for a
      run with none), ``dag_run.data_interval_*`` that run's data interval when it has one
      (the context's ``data_interval_*`` keys stay the business period's).
    - ``ti.try_number`` is the activity attempt; ``ti.xcom_pull`` returns the upstream tasks'
      XComs (any key) from this workflow's own results; ``ti.xcom_push`` keys reach the
      downstream tasks with the task's result. XComs of other runs or DAGs are not carried.
    - ``params`` are the DAG's and task's params, validated as Airflow validates them.
    - ``partition_key`` / ``partition_date`` (and ``dag_run``'s) are the Airflow run's asset
      partition, as Airflow's context holds them (None for a run without one).
    """
    from airflow.sdk.definitions.param import process_params
    from airflow.sdk.execution_time.context import (
        ConnectionAccessor,
        InletEventsAccessors,
        MacrosAccessor,
        OutletEventAccessors,
        VariableAccessor,
    )

    ti = WorkerTaskInstance(task, run.run_id, try_number, upstream, upstream_xcoms)
    logical = run.logical_date
    ts = logical.isoformat()
    return {
        "dag": task.dag,
        "task": task,
        "ti": ti,
        "task_instance": ti,
        "run_id": run.run_id,
        "dag_run": run,
        "params": process_params(task.dag, task, run.conf, suppress_exception=False),
        "logical_date": logical,
        "ds": ds,
        "ds_nodash": ds.replace("-", ""),
        "ts": ts,
        "ts_nodash": logical.strftime("%Y%m%dT%H%M%S"),
        "ts_nodash_with_tz": ts.replace("-", "").replace(":", ""),
        "data_interval_start": run.data_interval_start,
        "data_interval_end": run.data_interval_end,
        "task_instance_key_str": f"{task.dag_id}__{task.task_id}__{ds.replace('-', '')}",
        "inlets": task.inlets,
        "outlets": task.outlets,
        "outlet_events": OutletEventAccessors(),
        "inlet_events": InletEventsAccessors(task.inlets),
        "macros": MacrosAccessor(),
        "var": {
            "json": VariableAccessor(deserialize_json=True),
            "value": VariableAccessor(deserialize_json=False),
        },
        "conn": ConnectionAccessor(),
        "map_index_template": task.map_index_template,
        "triggering_asset_events": {},
        "partition_key": run.partition_key,
        "partition_date": run.partition_date,
    }


def run_operator(task: Any, context: dict[str, Any]) -> Any:
    """Renders the operator's templated fields and runs its ``execute`` as the task runner does.

    Returns:
        What ``execute`` returned (the task's XCom return value).
    """
    from airflow.sdk.bases.operator import ExecutorSafeguard
    from airflow.sdk.execution_time.context import set_current_context

    from bridge.worker.supervisor_channel import supervisor_channel

    _per_thread_current_context()
    # as the task runner's prepare_for_execution: no XComArg wiring on the attributes execute
    # sets (PythonOperator assigns op_kwargs the context, whose objects would be walked)
    task._lock_for_execution = True
    _mapped_results_in_fields(task, context["ti"])
    with set_current_context(cast("Context", context)):  # as the task runner sets it
        task.render_template_fields(context)
        calls = contextvars.copy_context()
        calls.run(ExecutorSafeguard.tracker.set, task)
        _run_hooks(task, context, "pre")
        # the class's own execute: a cluster policy may have wrapped the instance's with a
        # lease, and the activity already holds this task's lease
        own = any(c.__name__ == _OWN_ENVIRONMENT for c in type(task).__mro__)
        with supervisor_channel() if own else contextlib.nullcontext():
            result = calls.run(type(task).execute, task, context)
        _run_hooks(task, context, "post", result)
    return result


def _run_hooks(task: Any, context: dict[str, Any], when: str, result: Any = None) -> None:
    """The task's ``pre_execute=`` / ``post_execute=`` hook (``@task.run_if``, ``skip_if``),
    then its class's own ``pre_execute`` / ``post_execute`` when it overrides the base's, as
    the task runner's ``_execute_task`` runs them: through ``create_executable_runner`` (a
    generator hook is drained into the outlet events), the hook with the result after
    ``execute``, the override with the context only (Airflow 3.3 passes it no result)."""
    import logging

    from airflow.sdk.bases.operator import BaseOperator
    from airflow.sdk.execution_time.callback_runner import create_executable_runner

    log = logging.getLogger("airflow.task")
    events = context["outlet_events"]
    hook = getattr(task, f"_{when}_execute_hook", None)
    if hook is not None:
        runner = create_executable_runner(hook, events, logger=log)
        runner.run(context) if when == "pre" else runner.run(context, result)
    own = getattr(task, f"{when}_execute")
    if getattr(own, "__func__", None) is not getattr(BaseOperator, f"{when}_execute"):
        create_executable_runner(own, events, logger=log).run(context)


def _mapped_results_in_fields(task: Any, ti: WorkerTaskInstance) -> None:
    """A templated field holding a mapped task's output (``values=mapped.output``) gets that
    task's list of results, in map index order, as the workflow handed it on: Airflow's
    ``LazyXComSequence`` reads them from its API server, which a worker does not reach."""

    def resolved(value: Any, depth: int = 0) -> Any:
        if depth > 5:
            return value
        operator = getattr(value, "operator", None)
        if operator is not None and hasattr(value, "key") and getattr(operator, "is_mapped", False):
            return ti.xcom_pull(task_ids=operator.task_id, key=value.key)
        if isinstance(value, dict):
            return {k: resolved(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(resolved(v, depth + 1) for v in value)
        return value

    for field in getattr(task, "template_fields", ()):
        if hasattr(task, field):
            value = getattr(task, field)
            new = resolved(value)
            if new is not value:
                setattr(task, field, new)


class _ThreadContexts(list[Any]):
    """The task SDK's current-context stack, one per thread.

    The SDK keeps one process-wide list (one task per process in Airflow); a worker runs many
    activities at once on its threads, so each thread sees only the contexts it set.
    """

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def _stack(self) -> list[Any]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        stack: list[Any] = self._local.stack
        return stack

    def append(self, item: Any) -> None:
        self._stack().append(item)

    def pop(self, index: SupportsIndex = -1) -> Any:
        return self._stack().pop(index)

    def __getitem__(self, index: Any) -> Any:
        return self._stack()[index]

    def __len__(self) -> int:
        return len(self._stack())

    def __bool__(self) -> bool:
        return bool(self._stack())


_CONTEXTS = _ThreadContexts()


def _per_thread_current_context() -> None:
    """Installs ``_ThreadContexts`` where the task SDK reads and writes the current context."""
    from airflow.sdk.definitions._internal import contextmanager
    from airflow.sdk.execution_time import context

    for module in (contextmanager, context):
        if getattr(module, "_CURRENT_CONTEXT", None) is not _CONTEXTS:
            module._CURRENT_CONTEXT = _CONTEXTS  # type: ignore[attr-defined]
