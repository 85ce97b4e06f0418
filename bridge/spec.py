"""What the bridge hands to Temporal: a DAG's task graph and one run of it, as plain data.

These dataclasses are the one-in, one-out payloads of the workflows and activities. They import
nothing from Airflow or Temporal, so the workflow sandbox and the Airflow side share them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

#: A marker in a task's arguments standing for an upstream task's result.
UPSTREAM_MARKER = "$upstream"
RUN_TASK_ID = "dagrun"


class TaskKind(enum.StrEnum):
    """How the worker runs a task."""

    PYTHON = "python"  # a Python callable (@task, PythonOperator, a protected callable)
    EXECUTE = "execute"  # an operator whose execute() runs inside a worker
    NOOP = "noop"  # EmptyOperator and friends: nothing to run


class RunMode(enum.StrEnum):
    """Whether this engine's run is the one whose effects count."""

    PRIMARY = "primary"
    SHADOW = "shadow"


@dataclasses.dataclass(frozen=True)
class RetrySpec:
    """A task's retry policy: 5 attempts with exponential backoff unless the DAG says otherwise."""

    maximum_attempts: int = 5
    initial_interval_s: float = 1.0
    backoff_coefficient: float = 2.0
    maximum_interval_s: float = 300.0


@dataclasses.dataclass(frozen=True)
class SensorSpec:
    """How a sensor waits: the workflow pokes it, then sleeps on a durable timer between pokes.

    Attributes:
        poke_interval_s: the wait between two pokes.
        timeout_s: workflow time from the first poke after which a poke that did not fire times
            the sensor out (failed, or skipped with ``soft_fail``).
        soft_fail: a timeout or an ``AirflowFailException`` skips the task instead of failing it.
        never_fail: any error of a poke skips the task.
        exponential_backoff: the wait grows as ``BaseSensorOperator``'s does (with its jitter).
        max_wait_s: the longest wait between pokes under exponential backoff.
        deferrable: the first poke runs the operator's ``execute`` (which defers in Airflow);
            its deferral says what to wait for (a moment, or the same condition, polled).
    """

    poke_interval_s: float = 60.0
    timeout_s: float = 7 * 86400.0
    soft_fail: bool = False
    never_fail: bool = False
    exponential_backoff: bool = False
    max_wait_s: float | None = None
    deferrable: bool = False


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task of the graph.

    Attributes:
        task_id: the Airflow task id (part of the lease key).
        kind: how the worker runs it.
        upstream: task ids that must succeed first.
        callable_ref: ``module:qualname`` of an importable callable; None when the worker finds
            the task in its DAG folder instead.
        args: positional arguments; ``{"$upstream": "task"}`` stands for that task's result.
        kwargs: keyword arguments, with the same markers.
        fenced: the callable takes a ``fence`` argument and writes through its transactions.
        sink: the connection id of the sink its fence writes to (``AIRFLOW_CONN_<ID>``).
        side_effect_free: the DAG declares the task has no effect outside a fence (shadow-safe).
        map_over: the upstream task whose list result this task is expanded over.
        map_arg: the keyword argument each mapped item is passed as.
        map_key_field: for dict items, the field that names the item in its lease key.
        multiple_outputs: Airflow pushes each key of its dict result as an XCom of its own.
        trigger_rule: Airflow's trigger rule (``bridge.trigger_rules``), decided on ``direct``.
        direct: its direct upstream tasks, when ``upstream`` holds more (an operator's
            ancestors, whose XComs it may pull); None: ``upstream`` are the direct ones.
        timeout_s: start-to-close timeout of one attempt.
        heartbeat_s: heartbeat timeout: a silent worker is presumed dead after this long.
        lease_ttl_s: the task's lease TTL (renewed while it runs).
        retry: the retry policy.
        sensor: for a sensor, how it waits (``bridge.worker.workflows``: a poke activity, then
            durable timers); None for any other task.
        context_args: the context arguments (``ti``, ``task_state_store``, ...) a mapped
            callable takes, which the worker passes each item as Airflow's task runner does.
        expand: Airflow's ``expand()`` arguments when they are not one argument over one
            unmapped upstream list (``map_over``): ``(argument, source)`` pairs in ``expand()``'s
            order (a payload's dict keys come back sorted), each source a literal list or an
            upstream marker (a mapped upstream stands for its list). The items are their cross
            product in Airflow's map index order (the last argument varies fastest), each keyed
            by ``bridge.identity.expand_key``; for an ordinary task only.
        expand_kwargs: Airflow's ``expand_kwargs()`` source: a literal list of argument dicts
            or an upstream marker (a task returning one); one item per dict, in list order,
            keyed as an ``expand`` item; None: not mapped so.
        is_setup: a setup task (``as_setup()``, ``@setup``): a teardown's
            ``all_done_setup_success`` counts it, and its failure or skip reaches its work.
        is_teardown: a teardown task (``as_teardown()``, ``@teardown``): its failure does not
            fail the run unless ``on_failure_fail_dagrun``.
        on_failure_fail_dagrun: a teardown whose failure fails the run as any task's does.
        setups: its relevant setups that are not direct upstreams (Airflow's
            ``get_upstreams_only_setups``): one failed upstream-fails it, one skipped skips it.
        reads_airflow_run: what of the Airflow run it was handed over from the task decides
            from (``LatestOnlyOperator``: its run type and data interval; ``dag_run.conf``),
            which only a run handed over from Airflow carries (``AirflowRun``); empty: nothing.
    """

    task_id: str
    kind: TaskKind = TaskKind.PYTHON
    upstream: tuple[str, ...] = ()
    callable_ref: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    fenced: bool = False
    sink: str | None = None
    side_effect_free: bool = False
    map_over: str | None = None
    map_arg: str = "item"
    map_key_field: str | None = None
    multiple_outputs: bool = False
    trigger_rule: str = "all_success"
    direct: tuple[str, ...] | None = None
    timeout_s: float = 3600.0
    heartbeat_s: float = 30.0
    lease_ttl_s: float = 60.0
    retry: RetrySpec = dataclasses.field(default_factory=RetrySpec)
    sensor: SensorSpec | None = None
    context_args: tuple[str, ...] = ()
    expand: tuple[tuple[str, Any], ...] = ()
    expand_kwargs: Any = None
    is_setup: bool = False
    is_teardown: bool = False
    on_failure_fail_dagrun: bool = False
    setups: tuple[str, ...] = ()
    reads_airflow_run: str = ""

    @property
    def mapped(self) -> bool:
        """True for a mapped task (one activity per item)."""
        return self.map_over is not None or bool(self.expand) or self.expand_kwargs is not None


# Airflow timetables a Temporal Schedule reproduces run for run (one cron in one timezone; the
# data-interval one keys each tick by the interval it closes: identity.tick_business_date).
# Shown run for run on the real server by tests/bridge/test_schedule_keys.py.
SCHEDULABLE_TIMETABLES = frozenset({"CronTriggerTimetable", "CronDataIntervalTimetable"})


@dataclasses.dataclass(frozen=True)
class DagSpec:
    """A DAG as the bridge runs it.

    Attributes:
        dag_id: the DAG id (part of every lease key).
        tasks: the tasks, in any order.
        period: the business-date grain (``keys.Period`` value).
        timezone: the DAG's timezone (business dates are cut in it).
        schedule: the DAG's cron expression, for ``temporal-scheduled``.
        timetable: the class name of the DAG's Airflow timetable (what ``temporal-scheduled``
            must reproduce; None in specs from before it was recorded: a cron trigger).
        lane: the priority lane (task queue suffix) its work runs on.
    """

    dag_id: str
    tasks: tuple[TaskSpec, ...]
    period: str = "day"
    timezone: str = "UTC"
    schedule: str | None = None
    lane: str = "default"
    timetable: str | None = None

    def task(self, task_id: str) -> TaskSpec:
        """The task named ``task_id``.

        Raises:
            KeyError: no such task.
        """
        for spec in self.tasks:
            if spec.task_id == task_id:
                return spec
        raise KeyError(task_id)


@dataclasses.dataclass(frozen=True)
class AirflowRun:
    """The Airflow DAG run a business run was handed over from, as its tasks see it there.

    Attributes:
        run_type: Airflow's run type (``manual``, ``scheduled``, ``backfill``, ...).
        conf: the run's conf.
        data_interval_start: its data interval's start (ISO text; None: it has none).
        data_interval_end: its data interval's end (ISO text; None: it has none).
        logical_date: its logical date (ISO text; None: it has none).
    """

    run_type: str
    conf: dict[str, Any] = dataclasses.field(default_factory=dict)
    data_interval_start: str | None = None
    data_interval_end: str | None = None
    logical_date: str | None = None


def needs_airflow_run(spec: DagSpec) -> list[str]:
    """The tasks of ``spec`` that decide from the Airflow run handed over (``task: what``)."""
    return [f"{t.task_id}: {t.reads_airflow_run}" for t in spec.tasks if t.reads_airflow_run]


@dataclasses.dataclass(frozen=True)
class DagRunInput:
    """The DAG-run workflow's input: one business run of a DAG.

    Attributes:
        spec: the graph.
        business_date: the business date the run stands for.
        mode: primary (its effects count) or shadow (captured and rolled back).
        source: who started it (an Airflow run id, a schedule), for the audit.
        compare_poll_s: a shadow run polls the primary's leases this often before comparing.
        compare_wait_s: how long a shadow run waits for the primary before comparing anyway.
        map_key: when the run is one item of a mapped task (a handed-over Airflow map index),
            the item's key.
        fanout_threshold: a mapped task with more items than this runs them in child workflows.
        chunk_size: items per child workflow (keeps every history far from the event limit).
        partition_key: the Airflow run's asset partition key (None: not partitioned); part of
            the run's workflow id, lease keys and comparison row (``bridge.partition``).
        partition_date: its date as Airflow resolves it (ISO text; None for a key with none).
        airflow_run: the Airflow run it was handed over from (its type, conf and data
            interval: ``dag_run`` in its tasks' context); None: a run not handed over from one
            (``temporal-scheduled``, the CLI), which a DAG with ``reads_airflow_run`` tasks
            refuses before anything runs.
    """

    spec: DagSpec
    business_date: str
    mode: RunMode = RunMode.PRIMARY
    source: str = ""
    compare_poll_s: float = 30.0
    compare_wait_s: float = 86400.0
    map_key: str | None = None
    fanout_threshold: int = 200
    chunk_size: int = 500
    partition_key: str | None = None
    partition_date: str | None = None
    airflow_run: AirflowRun | None = None


@dataclasses.dataclass(frozen=True)
class TaskInput:
    """One activity call: a task (or one mapped item of it) of one business run."""

    dag_id: str
    business_date: str
    task: TaskSpec
    mode: RunMode
    upstream: dict[str, Any] = dataclasses.field(default_factory=dict)
    map_key: str | None = None
    map_value: Any = None
    #: the XComs other than the return value its upstream tasks pushed: task id -> key -> value
    upstream_xcoms: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: the run's asset partition (``DagRunInput``'s)
    partition_key: str | None = None
    partition_date: str | None = None
    #: a mapped item's position in its task's list (Airflow's ``map_index``); -1 unmapped
    map_index: int = -1
    #: the Airflow run it was handed over from (``DagRunInput``'s)
    airflow_run: AirflowRun | None = None


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """What one activity call did.

    Attributes:
        status: ``succeeded`` (ran now), ``recorded`` (done before: the recorded result),
            ``held`` (another live holder has the lease: wait ``wait_s`` and call again).
        key: the lease key used.
        result: the task's return value (JSON).
        token: the fencing token it ran under.
        duration_ms: how long the work took.
        captured: in shadow mode, the ledger items and rows its transactions wrote before the
            rollback.
        holder: for ``held``, who holds the lease.
        xcoms: the XComs other than the return value it pushed (``multiple_outputs`` keys too).
        skip: the downstream tasks it skipped (a branch or short-circuit operator); a task
            that skipped itself (``AirflowSkipException``) has status ``skipped``.
    """

    status: str
    key: str
    result: Any = None
    token: int | None = None
    duration_ms: int = 0
    captured: dict[str, Any] = dataclasses.field(default_factory=dict)
    wait_s: float = 0.0
    holder: str | None = None
    xcoms: dict[str, Any] = dataclasses.field(default_factory=dict)
    skip: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class PokeInput:
    """One poke of a sensor: ``execute`` for a deferrable sensor's first, ``poke`` otherwise."""

    task: TaskInput
    execute: bool = False


@dataclasses.dataclass(frozen=True)
class PokeResult:
    """What one poke found.

    Attributes:
        status: ``fired`` (the condition holds), ``waiting`` (poke again later), ``skipped``
            (``AirflowSkipException``, or an error under ``soft_fail`` / ``never_fail``),
            ``deferred`` (a deferrable sensor's ``execute`` deferred).
        result: a fired sensor's return value (a ``PokeReturnValue``'s ``xcom_value``).
        xcoms: the XComs other than the return value it pushed.
        until: for ``deferred`` on a time trigger, the moment it waits for (ISO, UTC); None:
            it waits on its condition, polled with ``poke``.
        timeout_s: for ``deferred``, the deferral's timeout (None: none, as in Airflow).
    """

    status: str
    result: Any = None
    xcoms: dict[str, Any] = dataclasses.field(default_factory=dict)
    until: str | None = None
    timeout_s: float | None = None


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """A task's outcome in a run: its status, result and, for mapped tasks, one per item."""

    status: str
    result: Any = None
    error: str | None = None
    duration_ms: int = 0
    keys: tuple[str, ...] = ()
    captured: dict[str, Any] = dataclasses.field(default_factory=dict)
    xcoms: dict[str, Any] = dataclasses.field(default_factory=dict)
    skip: tuple[str, ...] = ()
    #: a mapped task's results by item name (its lease keys' map keys); ``result`` is then the
    #: list Airflow hands on (the items' non-None results in map index order)
    items: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DagRunResult:
    """The DAG-run workflow's output."""

    dag_id: str
    business_date: str
    mode: RunMode
    status: str
    tasks: dict[str, TaskOutcome]
    duration_ms: int = 0
    partition_key: str | None = None

    @property
    def failed(self) -> list[str]:
        """The tasks that failed (not those skipped because an upstream failed)."""
        return [t for t, o in self.tasks.items() if o.status == "failed"]


@dataclasses.dataclass(frozen=True)
class MappedChunkInput:
    """A child workflow's share of a large fan-out."""

    template: TaskInput
    items: tuple[tuple[str, Any], ...]
    concurrency: int = 50
    #: the position of its first item in the task's list (their ``map_index`` counts from it)
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class MappedChunkResult:
    """A child workflow's results, one per item, in item order (errors as text)."""

    results: tuple[TaskResult | None, ...]
    errors: tuple[str | None, ...]


@dataclasses.dataclass(frozen=True)
class ScheduledRunInput:
    """The input of the workflow a Temporal Schedule starts (``temporal-scheduled`` mode)."""

    spec: DagSpec
    task_queue: str


@dataclasses.dataclass(frozen=True)
class Handoff:
    """Where a handed-over business run is.

    Attributes:
        workflow_id: the key-derived workflow id.
        run_id: the execution's run id (None when the lease store says it is done already).
        started: True when this call started the execution; False when it attached.
        recorded: when the run key's lease is succeeded: its recorded result (nothing started).
    """

    workflow_id: str
    run_id: str | None
    started: bool
    recorded: Any = None
