"""The translatability report: which of a DAG's tasks the bridge can run in Temporal, and why not.

Translation reads a parsed Airflow DAG (never runs it) and yields a ``DagSpec`` plus, for every
task it cannot translate, its name and the reason. Nothing is handed over while any task is
untranslatable: the report comes before anything runs. ``task_spec`` lists what translates and
what does not.

DAG tags the bridge reads: ``side-effect-free`` (every task) or ``side-effect-free:<task_id>``,
and ``bridge-lane:<lane>`` (the priority lane, e.g. ``billing``).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from airflow_plugins.protection.task_identity import dag_period, dag_timezone
from bridge.in_airflow.code_use import (
    AIRFLOW_RUN_READS,
    ASYNC,
    CONTEXT_ARGUMENT,
    MAPPED_CONTEXT,
    RETURN_KEY,
    Use,
    callable_uses,
    is_mapped,
    template_uses,
)
from bridge.in_airflow.refusals import (
    AIRFLOW_RUN_STATE,
    HOOKS,
    IN_PROCESS,
    LATEST_ONLY,
    OWN_ENVIRONMENT,
    SKIPPING,
    NotTranslatable,
    class_names,
    elsewhere,
    refuse_kinds,
    refuse_own_environment,
    trigger_rule,
)
from bridge.spec import (
    SCHEDULABLE_TIMETABLES,
    UPSTREAM_MARKER,
    DagSpec,
    RetrySpec,
    SensorSpec,
    TaskKind,
    TaskSpec,
)
from bridge.worker.execution import XCOM_ARGUMENT

SIDE_EFFECT_FREE_TAG = "side-effect-free"
LANE_TAG = "bridge-lane:"
_NOT_SCANNED = ("airflow.sdk.", "airflow.models.", "typing", "abc", "builtins")
_DEFERS = ".defer("
_METADATA_DB = ("create_session", "provide_session", "settings.Session", "airflow.models")


@dataclasses.dataclass(frozen=True)
class Untranslatable:
    """A task the bridge cannot run, and why."""

    task_id: str
    operator: str
    reason: str
    construct: str = ""


@dataclasses.dataclass(frozen=True)
class Translation:
    """A DAG's translation: the spec (when every task translated) and what did not."""

    dag_id: str
    spec: DagSpec | None
    untranslatable: tuple[Untranslatable, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every task translated."""
        return not self.untranslatable

    def report(self) -> str:
        """The human-readable report."""
        if self.ok:
            lines = [
                f"{self.dag_id}: translatable ({len(self.spec.tasks) if self.spec else 0} tasks)"
            ]
        else:
            lines = [f"{self.dag_id}: NOT translatable"]
        lines += [
            f"  - {u.task_id} ({u.operator}) [{u.construct}]: {u.reason}"
            for u in self.untranslatable
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class UntranslatableDag(ValueError):
    """A DAG with tasks the bridge cannot run; the message lists them by name with reasons."""

    def __init__(self, translation: Translation) -> None:
        self.translation = translation
        super().__init__(translation.report())


def dag_lane(dag: Any) -> str:
    """The worker lane ``dag`` runs on (tag ``bridge-lane:<name>``; ``default`` without)."""
    tags = getattr(dag, "tags", None) or ()
    return next((t.removeprefix(LANE_TAG) for t in tags if t.startswith(LANE_TAG)), "default")


def declared_side_effect_free(dag: Any, task_id: str) -> bool:
    """True when ``dag`` declares task ``task_id`` free of effects outside a fence (tag
    ``side-effect-free`` for every task, ``side-effect-free:<task_id>`` for one)."""
    tags = set(getattr(dag, "tags", None) or ())
    return SIDE_EFFECT_FREE_TAG in tags or f"{SIDE_EFFECT_FREE_TAG}:{task_id}" in tags


def translate(dag: Any, *, render: Callable[[Any, Any], Any] | None = None) -> Translation:
    """Translates a parsed Airflow DAG.

    Args:
        dag: the DAG (``airflow.sdk.DAG`` or a serialized DAG with tasks).
        render: renders one task's templated argument (the bridge operator passes Airflow's
            renderer at run time); without it, a templated argument is untranslatable.
    """
    lane = dag_lane(dag)
    specs: list[TaskSpec] = []
    bad: list[Untranslatable] = []
    notes: list[str] = []
    for task in dag.tasks:
        free = declared_side_effect_free(dag, task.task_id)
        operator = type(task).__name__
        try:
            specs.append(task_spec(task, side_effect_free=free, render=render))
        except NotTranslatable as exc:
            bad += [Untranslatable(task.task_id, operator, u.reason, u.construct) for u in exc.uses]
        except Exception as exc:  # the report must never crash on a DAG
            bad.append(uninspectable(task.task_id, operator, exc))
    missing = _required_params(dag)
    if missing:
        # each task validates the params with the run's conf, as Airflow's task runner does:
        # the conf of the Airflow run handed over (AirflowRun) gives them
        need = f"params {', '.join(missing)} without a default"
        specs = [
            dataclasses.replace(
                s, reads_airflow_run=", ".join(filter(None, (s.reads_airflow_run, need)))
            )
            for s in specs
        ]
    emitting = sorted(t.task_id for t in dag.tasks if getattr(t, "outlets", None))
    if emitting:
        notes.append(
            f"asset outlets ({', '.join(emitting)}): the worker emits no asset events, so once "
            "the DAG is temporal-scheduled, DAGs scheduled on those assets do not run"
        )
    timetable = getattr(dag, "timetable", None)
    expression = getattr(timetable, "expression", None) or getattr(timetable, "_expression", None)
    kind = type(timetable).__name__ if timetable is not None else None
    if kind not in SCHEDULABLE_TIMETABLES:
        notes.append(
            f"its timetable {kind} cannot be reproduced by a Temporal Schedule: "
            "temporal-scheduled mode is not available"
        )
    spec = DagSpec(
        dag_id=dag.dag_id,
        tasks=tuple(specs),
        period=dag_period(dag).value,
        timezone=dag_timezone(dag),
        schedule=expression if isinstance(expression, str) else None,
        lane=lane,
        timetable=kind,
    )
    return Translation(dag.dag_id, None if bad else spec, tuple(bad), tuple(notes))


def _required_params(dag: Any) -> list[str]:
    """DAG params without a default: Airflow's trigger must give them in the run's conf."""
    params: Any = getattr(dag, "params", None) or {}
    try:
        return sorted(k for k in params if not params.get_param(k).has_value)
    except Exception:  # a plain dict of params: every one has its value
        return []


def uninspectable(task_id: str, operator: str, exc: Exception) -> Untranslatable:
    reason = f"could not inspect: {type(exc).__name__}: {exc}".splitlines()[0][:300]
    return Untranslatable(task_id, operator, reason, "could not inspect")


def task_spec(
    task: Any,
    *,
    side_effect_free: bool = False,
    render: Callable[[Any, Any], Any] | None = None,
) -> TaskSpec:
    """The spec of one task: what translates and what does not.

    Runs unchanged: ``@task`` / PythonOperator callables, ``ExactlyOnceOperator`` /
    ``@exactly_once_task`` bodies (they get the same ``Fence``), EmptyOperator, mapped versions
    of these and of other operators (``expand()`` over upstream or literal lists, several
    arguments, a mapped task's list; ``expand_kwargs()``), and any other operator whose
    ``execute(context)`` can run in a worker (BashOperator, SQL operators, ...): the worker
    rebuilds it from its DAG folder, renders its templated fields and calls ``execute``
    (``bridge.worker.execution``); sensors with a ``poke`` of their own, which the workflow pokes
    between durable timers (``bridge.worker.workflows.sense``; deferrable ones too); setup and
    teardown tasks, in task groups too (their flags, ``on_failure_fail_dagrun`` and the relevant
    indirect setups go in the spec: the workflow decides them as Airflow, ``trigger_rules``).
    Not translated, with the reason: sensors without a ``poke`` of their own, deferrable
    operators (a ``deferrable`` flag, or a class whose code calls ``.defer(``), operators whose
    code reaches Airflow's metadata DB (``create_session``, ``provide_session``,
    ``airflow.models``), operators that cannot be copied, mapped operators the worker cannot
    unmap (serialized, branching), mapped setups/teardowns, trigger rules the workflow does not
    decide, cross-DAG operators, and Python-callable arguments holding Jinja templates (only
    Airflow renders them); and what Airflow does around the code that the worker does not
    (callbacks, a mapped or protected task's run_if/skip_if, depends_on_past, asset outlets,
    callables run elsewhere: a
    mapped ``@task.bash`` or ``@task.virtualenv``, ``@task.docker``, ...) or what the code uses
    that the worker does not give it (``bridge.in_airflow.code_use``: context arguments, XCom
    keys, a fenced ``async def``, template context the worker lacks, a virtualenv callable
    importing Airflow). What decides from the Airflow run handed over (``LatestOnlyOperator``,
    a template's ``dag_run.conf``, params without a default) translates, its reason in
    ``reads_airflow_run``: a run without one is refused before anything runs. An unmapped
    task's pre/post-execute hooks run around its operator's execute. MIGRATION.md lists every
    refusal.

    Raises:
        NotTranslatable: with the reason.
    """
    partial: Mapping[str, Any] = getattr(task, "partial_kwargs", None) or {}
    refuse_kinds(task, partial)
    names = class_names(task)
    mapped = "MappedOperator" in names
    fn = getattr(task, "python_callable", None) or partial.get("python_callable")
    fn = getattr(fn, "_exactly_once_original", fn)
    common = _common(task, partial)
    if "EmptyOperator" in names:
        return TaskSpec(task.task_id, kind=TaskKind.NOOP, side_effect_free=True, **common)
    if "BaseSensorOperator" in names:
        return _sensor_spec(task, fn, names, side_effect_free, common)
    if not mapped and ("_BashDecoratedOperator" in names or names & OWN_ENVIRONMENT):
        # @task.bash: its execute calls the function (with the context) and runs the returned
        # command with bash; a virtualenv / external python: its execute builds the virtualenv
        # (or takes the interpreter) and runs the callable there; both as Airflow's worker does
        refuse_own_environment(task, fn, names)
        return _operator_spec(task, names, mapped, side_effect_free, common)
    if fn is None or (names & SKIPPING and not mapped) or (_hooked(task, fn) and not mapped):
        # a branch / short-circuit operator runs through its execute: it names the tasks to
        # skip; a task with a pre/post-execute hook: the worker runs it around the execute
        return _operator_spec(task, names, mapped, side_effect_free, common)
    if not names & IN_PROCESS or names & OWN_ENVIRONMENT:
        cls = getattr(getattr(task, "operator_class", None), "__name__", type(task).__name__)
        raise NotTranslatable(*elsewhere(cls, names, mapped=mapped))
    args = list((getattr(task, "op_args", None) if not mapped else partial.get("op_args")) or ())
    kwargs = dict(
        (getattr(task, "op_kwargs", None) if not mapped else partial.get("op_kwargs")) or {}
    )
    params = list(inspect.signature(fn).parameters)
    map_over, map_arg, expand, expand_kwargs = (
        _callable_expansion(task, render, "fence" in params) if mapped else _UNMAPPED
    )
    # the worker passes the fence first when it is the first parameter, then the arguments
    positional = params[1:] if params[:1] == ["fence"] else params
    mapped_args = _mapped_arguments(map_over, map_arg, expand, expand_kwargs, params)
    passed = {*kwargs, *positional[: len(args)], "fence", *mapped_args}
    ancestors = tuple(sorted(task.get_flat_relative_ids(upstream=True)))
    uses = callable_uses(fn, passed=passed, wired=ancestors, task_id=task.task_id)
    try:
        args, kwargs = _arguments(args, render), _arguments(kwargs, render)
    except NotTranslatable as exc:
        uses += exc.uses
    refused = [u for u in uses if not u.carried]
    # a mapped callable is given its context arguments per item, and its coroutine is run to
    # completion, by the activity (bridge.worker.activities); a fenced one keeps its arguments
    context_args = (
        tuple(p for p in params if p in MAPPED_CONTEXT and p not in passed)
        if mapped and "fence" not in params
        else ()
    )
    if "fence" in params or mapped:

        def given(use: Use) -> bool:
            if "fence" in params or not use.carried:
                return False
            return use.construct == ASYNC or (
                use.construct == CONTEXT_ARGUMENT and use.reason in context_args
            )

        refused = [u if not u.carried else _uncarried(u) for u in uses if not given(u)]
    elif uses and not refused:
        # it reads the context or XCom keys: run it as Airflow does, through its operator's
        # execute with the worker's context (which renders its templated arguments too)
        return _operator_spec(task, names, mapped, side_effect_free, common)
    if refused:
        raise NotTranslatable(refused[0].reason, uses=refused)
    sink = getattr(task, "sink_conn_id", None) or partial.get("sink_conn_id")
    return TaskSpec(
        task.task_id,
        kind=TaskKind.PYTHON,
        callable_ref=_importable(fn),
        args=tuple(args),
        kwargs=dict(kwargs),
        fenced="fence" in params,
        sink=sink,
        side_effect_free=side_effect_free,
        map_over=map_over,
        map_arg=map_arg,
        expand=expand,
        expand_kwargs=expand_kwargs,
        multiple_outputs=bool(getattr(task, "multiple_outputs", False)),
        context_args=context_args,
        **common,
    )


def _hooked(task: Any, fn: Callable[..., Any] | None) -> bool:
    """Whether the task has a pre/post-execute hook (``@task.run_if``, ``skip_if``,
    ``pre_execute=``), which the worker runs around its operator's execute as Airflow does.

    Raises:
        NotTranslatable: a protected callable's (it is called with its fence, no hooks).
    """
    hooked = getattr(task, "_pre_execute_hook", None) or getattr(task, "_post_execute_hook", None)
    if fn is not None and hooked and "fence" in inspect.signature(fn).parameters:
        raise NotTranslatable(
            "a protected callable with a pre/post-execute hook (@task.run_if, @task.skip_if): "
            "it is called with its fence and arguments, not through its operator's execute with "
            "the hooks around it; decide inside the callable",
            HOOKS,
        )
    return bool(hooked)


def _uncarried(use: Use) -> Use:
    """Why a protected or mapped callable cannot have what an ordinary task is given."""
    return Use(
        use.construct,
        f"{use.reason}: a fenced or mapped callable is called with its arguments only, not run "
        "through its operator with the context; pass the value as an argument",
    )


def _sensor_spec(
    task: Any, fn: Any, names: set[str], side_effect_free: bool, common: dict[str, Any]
) -> TaskSpec:
    """A sensor: the workflow pokes it in an activity and waits on durable timers between
    pokes (``bridge.worker.workflows.sense``); its ``poke`` runs on the rebuilt operator with the
    worker's context, as ``execute`` would. A deferrable one's first poke is its ``execute``."""
    spec = _operator_spec(task, names, False, side_effect_free, common, sensor=True)
    if fn is not None:  # PythonSensor, @task.sensor: its callable gets the context by name
        ancestors = spec.upstream
        args = list(getattr(task, "op_args", None) or ())
        kwargs = dict(getattr(task, "op_kwargs", None) or {})
        params = list(inspect.signature(fn).parameters)
        passed = {*kwargs, *params[: len(args)]}
        uses = callable_uses(fn, passed=passed, wired=ancestors, task_id=task.task_id)
        refused = [u for u in uses if not u.carried]
        if refused:
            raise NotTranslatable(refused[0].reason, uses=refused)
    flag = getattr(task, "deferrable", None)
    max_wait = getattr(task, "max_wait", None)
    sensor = SensorSpec(
        poke_interval_s=float(task.poke_interval),
        timeout_s=float(task.timeout),
        soft_fail=bool(task.soft_fail),
        never_fail=bool(getattr(task, "never_fail", False)),
        exponential_backoff=bool(task.exponential_backoff),
        max_wait_s=_seconds(max_wait) if max_wait is not None else None,
        deferrable=_class_defers(task) if flag is None else bool(flag),
    )
    return dataclasses.replace(spec, sensor=sensor)


def _operator_spec(
    task: Any,
    names: set[str],
    mapped: bool,
    side_effect_free: bool,
    common: dict[str, Any],
    *,
    sensor: bool = False,
) -> TaskSpec:
    """An operator whose ``execute(context)`` the worker runs after rebuilding it from its DAG
    folder and rendering its templated fields (``bridge.worker.execution``). A ``sensor``'s
    code may defer: the workflow carries its deferral."""
    expand: tuple[tuple[str, Any], ...] = ()
    expand_kwargs: Any = None
    cls_of = type(task)
    flagged = hasattr(task, "deferrable")
    if mapped:
        # each item runs the operator Airflow's task runner unmaps for it (``unmap``)
        # its templated fields, expanded ones too, are rendered by the worker (as in Airflow)
        map_over, map_arg, expand, expand_kwargs = _expansion(task, lambda value, _: value)
        if map_over is not None:  # one argument over one upstream list: the same, as pairs
            expand = ((map_arg, {UPSTREAM_MARKER: map_over}),)
        cls_of = task.operator_class
        if not isinstance(cls_of, type) or names & SKIPPING:
            raise NotTranslatable(
                "a mapped operator the worker cannot unmap (serialized, branching): translate "
                "from the DAG file",
                "mapped operator",
            )
        flagged = "deferrable" in inspect.signature(cls_of.__init__).parameters
    elif "SerializedBaseOperator" in names or not callable(getattr(task, "execute", None)):
        raise NotTranslatable(
            "a serialized task: translate from the DAG file, not the DB", "serialized"
        )
    for cls in cls_of.__mro__:
        if cls.__module__.startswith(_NOT_SCANNED) or cls.__name__ in AIRFLOW_RUN_STATE:
            continue  # LatestOnlyOperator imports airflow.models for its type hints only
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        # an operator with a deferrable flag (False here, see _refuse_kinds) defers only when
        # asked to; one without the flag may defer whenever its code says so
        if _DEFERS in source and not flagged and not sensor:
            raise NotTranslatable(
                f"deferrable: {cls.__name__} calls defer(), which waits on an Airflow trigger",
                "deferrable",
            )
        used = next((m for m in _METADATA_DB if m in source), None)
        if used is not None:
            raise NotTranslatable(
                f"needs Airflow's metadata DB ({cls.__name__} uses {used}), which a worker "
                "does not reach",
                "metadata DB",
            )
    try:
        copy.deepcopy(task)  # what the worker does before each run
    except Exception as exc:
        raise NotTranslatable(f"the worker cannot rebuild it: {exc}", "cannot rebuild") from exc
    # Airflow lets an operator pull any task of its run that ran before it: every ancestor
    # becomes an upstream (already implied under all_success), so the workflow passes its result
    ancestors = tuple(sorted(task.get_flat_relative_ids(upstream=True)))
    fields = _MappedFields(task, expand, expand_kwargs) if mapped else task
    uses = template_uses(fields, wired=ancestors)
    refused = [u for u in uses if not u.carried]
    if refused:
        raise NotTranslatable(refused[0].reason, uses=refused)
    xcom = {u: {UPSTREAM_MARKER: u} for u in ancestors}
    return TaskSpec(
        task.task_id,
        kind=TaskKind.EXECUTE,
        kwargs={XCOM_ARGUMENT: xcom},
        expand=expand,
        expand_kwargs=expand_kwargs,
        side_effect_free=side_effect_free,
        multiple_outputs=bool(getattr(task, "multiple_outputs", False)),
        reads_airflow_run=_run_reads(names, uses),
        **{**common, "upstream": ancestors, "direct": common["upstream"]},
    )


def _run_reads(names: set[str], uses: list[Use]) -> str:
    """What an operator decides from the Airflow run handed over (``TaskSpec.reads_airflow_run``):
    a ``LatestOnlyOperator`` its type and data interval, a template its ``dag_run.conf``."""
    reads = [LATEST_ONLY] if names & AIRFLOW_RUN_STATE else []
    reads += [u.construct for u in uses if u.construct in AIRFLOW_RUN_READS]
    return ", ".join(dict.fromkeys(reads))


class _MappedFields:
    """A mapped operator as ``template_uses`` reads it: each templated field holds the values
    ``partial()`` and the literal lists of ``expand()`` / ``expand_kwargs()`` give it (an
    upstream's values are not known before the run)."""

    def __init__(self, task: Any, expand: tuple[tuple[str, Any], ...], kwargs: Any) -> None:
        self._task = task
        partial: Mapping[str, Any] = getattr(task, "partial_kwargs", None) or {}
        literal = {a: v for a, v in expand if isinstance(v, list)}
        sets = kwargs if isinstance(kwargs, list) else []
        self._fields: dict[str, list[Any]] = {}
        for field in getattr(task, "template_fields", ()) or ():
            given = [partial.get(field), *literal.get(field, []), *(d.get(field) for d in sets)]
            self._fields[field] = [v for v in given if v is not None]

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("_fields", {})
        return fields[name] if name in fields else getattr(self.__dict__["_task"], name)


def _class_defers(task: Any) -> bool:
    """True when the code of a task's class (not Airflow's own) calls ``.defer(``."""
    for cls in type(task).__mro__:
        if cls.__module__.startswith(_NOT_SCANNED):
            continue
        try:
            if _DEFERS in inspect.getsource(cls):
                return True
        except (OSError, TypeError):
            continue
    return False


def _common(task: Any, partial: Mapping[str, Any]) -> dict[str, Any]:
    def attr(name: str, default: Any) -> Any:
        value = getattr(task, name, None)
        return partial.get(name, default) if value is None else value

    retries = int(attr("retries", 4) or 0)
    delay = attr("retry_delay", timedelta(seconds=30))
    max_delay = attr("max_retry_delay", None) or timedelta(minutes=10)
    timeout = attr("execution_timeout", None)
    teardown = bool(getattr(task, "is_teardown", False))
    return {
        "upstream": tuple(sorted(task.upstream_task_ids)),
        "trigger_rule": trigger_rule(task),
        "is_setup": bool(getattr(task, "is_setup", False)),
        "is_teardown": teardown,
        "on_failure_fail_dagrun": teardown and bool(getattr(task, "on_failure_fail_dagrun", False)),
        "setups": () if teardown else _indirect_setups(task),
        "timeout_s": timeout.total_seconds() if timeout else 3600.0,
        "retry": RetrySpec(
            maximum_attempts=retries + 1,
            initial_interval_s=max(0.1, _seconds(delay)),
            backoff_coefficient=2.0 if attr("retry_exponential_backoff", False) else 1.0,
            maximum_interval_s=max(_seconds(delay), _seconds(max_delay)),
        ),
    }


def _indirect_setups(task: Any) -> tuple[str, ...]:
    """Its relevant setups that are not direct upstreams (Airflow's setup constraint): the
    upstream setups without teardowns, or with a teardown downstream of the task."""
    direct = set(task.upstream_task_ids)
    relevant = {s.task_id for s in task.get_upstreams_only_setups()}
    return tuple(sorted(relevant - direct))


def _seconds(value: Any) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


_Expansion = tuple[str | None, str, tuple[tuple[str, Any], ...], Any]
_UNMAPPED: _Expansion = (None, "item", (), None)


def _expansion(task: Any, render: Callable[[Any, Any], Any] | None) -> _Expansion:
    """What a mapped task is expanded over: ``(map_over, map_arg, (), None)`` for one argument
    over one unmapped upstream task's list (keyed by the item, or ``map_key_field``); else
    ``(None, "item", expand, None)``: each argument with its literal list or upstream marker (a
    mapped upstream's list too), crossed in Airflow's map index order (``bridge.identity``); for
    ``expand_kwargs()``, ``(None, "item", (), source)``: its literal list of argument dicts or
    its upstream marker."""
    expand = getattr(task, "op_kwargs_expand_input", None) or getattr(task, "expand_input", None)
    value = getattr(expand, "value", None)
    if not isinstance(value, Mapping):
        return None, "item", (), _kwargs_source(value, render)
    sources: dict[str, Any] = {}
    for arg, source in value.items():
        producer = getattr(source, "operator", None)
        if producer is not None and hasattr(source, "key"):
            sources[arg] = _upstream_list(source)
        elif isinstance(source, list | tuple):
            sources[arg] = _arguments(list(source), render)
        else:
            raise NotTranslatable(
                f"mapped over a {type(source).__name__} (.map(), zip(), concat(), a dict): "
                "map over a list or a task's own output",
                "expand",
            )
    if len(sources) == 1:
        ((arg, source),) = sources.items()
        upstream = source.get(UPSTREAM_MARKER) if isinstance(source, dict) else None
        if upstream is not None and not is_mapped(task.dag.get_task(upstream)):
            return upstream, arg, (), None
    return None, "item", tuple(sources.items()), None


def _upstream_list(source: Any) -> dict[str, str]:
    """The upstream marker of an XComArg mapped over: a task's own output (a mapped task's is
    its list), never an XCom key or a task in a mapped task group."""
    producer = source.operator
    if source.key != RETURN_KEY:
        raise NotTranslatable(
            f"mapped over XCom key {source.key!r} of {producer.task_id!r}: map over a task's "
            "own output",
            "expand",
        )
    if is_mapped(producer) and "MappedOperator" not in class_names(producer):
        raise NotTranslatable(
            f"mapped over {producer.task_id!r} in a mapped task group: map over a single "
            "task's output",
            "map over mapped",
        )
    return {UPSTREAM_MARKER: producer.task_id}


def _kwargs_source(value: Any, render: Callable[[Any, Any], Any] | None) -> Any:
    """``expand_kwargs()``'s source: an upstream task's output, or a literal list of argument
    dicts of literal values (an XComArg inside one is not resolved per item by the bridge)."""
    if hasattr(value, "operator") and hasattr(value, "key"):
        return _upstream_list(value)
    if isinstance(value, list | tuple) and all(isinstance(d, Mapping) for d in value):
        if not any(_holds_xcom_arg(v) for d in value for v in d.values()):
            return [dict(d) for d in _arguments([dict(d) for d in value], render)]
    raise NotTranslatable(
        "expand_kwargs over something other than a task's output or a literal list of "
        "argument dicts of values (an XComArg in one, .map(), zip())",
        "expand_kwargs",
    )


def _holds_xcom_arg(value: Any) -> bool:
    return "XComArg" in {c.__name__ for c in type(value).__mro__}


def _mapped_arguments(
    map_over: str | None,
    map_arg: str,
    expand: tuple[tuple[str, Any], ...],
    kwargs: Any,
    params: list[str],
) -> list[str]:
    """The arguments each mapped item passes (``expand_kwargs``'s: any of the callable's)."""
    if kwargs is not None:
        return [p for p in params if p != "fence"]
    return [a for a, _ in expand] if expand else [map_arg] if map_over else []


def _callable_expansion(
    task: Any, render: Callable[[Any, Any], Any] | None, fenced: bool
) -> _Expansion:
    """A mapped callable's expansion (``_expansion``); a protected one keeps its one form."""
    _, _, expand, expand_kwargs = found = _expansion(task, render)
    if (expand or expand_kwargs is not None) and fenced:
        raise NotTranslatable(
            "a protected task mapped over a literal list, several arguments or a mapped task: "
            "map one argument over one upstream task's list (keyed by map_key_field)",
            "expand",
        )
    return found


def _importable(fn: Callable[..., Any]) -> str | None:
    module = getattr(fn, "__module__", "") or ""
    qualname = getattr(fn, "__qualname__", "") or ""
    if not module or "<locals>" in qualname or module.startswith("unusual_prefix_"):
        return None  # defined in a DAG file: the worker finds it in its DAG folder
    return f"{module}:{qualname}"


def _arguments(value: Any, render: Callable[[Any, Any], Any] | None) -> Any:
    if hasattr(value, "operator") and hasattr(value, "key"):  # an XComArg
        producer = value.operator
        if value.key != RETURN_KEY and not is_mapped(producer):
            outputs = getattr(producer, "multiple_outputs", False)
            construct = "multiple_outputs key" if outputs else "XCom key"
            raise NotTranslatable(
                f"uses XCom key {value.key!r} of {producer.task_id!r}",
                uses=[Use(construct, f"XCom key {value.key!r}", carried=True)],
            )
        # a mapped producer's result is Airflow's list of its items' results, in map index
        # order (bridge.worker.workflows._merge), whatever its items' lease keys
        return {UPSTREAM_MARKER: producer.task_id}
    if "XComArg" in type(value).__name__:  # .map(), zip(), concat()
        raise NotTranslatable(
            f"a {type(value).__name__} (.map(), zip(), concat()): only a task's own output is "
            "passed; transform it in the callable",
            "XComArg transform",
        )
    if isinstance(value, str) and "{{" in value:
        if render is None:
            raise NotTranslatable(
                f"argument {value!r} is a Jinja template only Airflow renders; hand the run over "
                "from Airflow (the bridge operator renders it) or pass the value",
                "Jinja argument",
            )
        return render(value, None)
    if isinstance(value, Mapping):
        return {k: _arguments(v, render) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_arguments(v, render) for v in value]
    return value


def inventory(dags: Iterable[Any]) -> list[Translation]:
    """Translates every DAG (the inventory a migration starts from). Never raises on a DAG: one
    that cannot be inspected is reported untranslatable with the exception."""
    dags = list(dags)
    found: list[Translation] = []
    for dag in sorted(dags, key=lambda d: str(getattr(d, "dag_id", ""))):
        try:
            found.append(translate(dag))
        except Exception as exc:
            dag_id = str(getattr(dag, "dag_id", "?"))
            bad = uninspectable("(dag)", type(dag).__name__, exc)
            found.append(Translation(dag_id, None, (bad,)))
    return _refuse_asset_conflicts(dags, found)


def _tasks(dag: Any) -> list[Any]:
    """A DAG's tasks, or none when they cannot be read (the DAG is refused for that already)."""
    try:
        return list(getattr(dag, "tasks", ()) or ())
    except Exception:
        return []


def _assets(task: Any) -> list[tuple[str, str]]:
    """The (uri, name) of every asset a task reads or writes."""
    out: list[tuple[str, str]] = []
    for a in [*(getattr(task, "inlets", None) or ()), *(getattr(task, "outlets", None) or ())]:
        uri, name = getattr(a, "uri", None), getattr(a, "name", None)
        if isinstance(uri, str) and isinstance(name, str):
            out.append((uri, name))
    return out


def _refuse_asset_conflicts(dags: list[Any], found: list[Translation]) -> list[Translation]:
    """Refuses the tasks whose asset another DAG declares with the same URI under another name
    (or the same name with another URI): Airflow keeps one of them active and fails the tasks of
    the other (``AirflowInactiveAssetInInletOrOutletException``); the bridge does not know which."""
    names: dict[str, set[str]] = {}
    uris: dict[str, set[str]] = {}
    for dag in dags:
        for task in _tasks(dag):
            for uri, name in _assets(task):
                names.setdefault(uri, set()).add(name)
                uris.setdefault(name, set()).add(uri)
    by_id = {str(getattr(d, "dag_id", "")): d for d in dags}
    out: list[Translation] = []
    for t in found:
        dag = by_id.get(t.dag_id)
        clashes = [
            Untranslatable(
                task.task_id,
                type(task).__name__,
                f"its asset {uri!r} (name {name!r}) is declared by another DAG under another "
                "name or URI: Airflow marks one of them inactive and fails the tasks using it",
                "asset conflict",
            )
            for task in (_tasks(dag) if t.ok else ())
            for uri, name in _assets(task)
            if len(names[uri]) > 1 or len(uris[name]) > 1
        ]
        refused = dataclasses.replace(t, spec=None, untranslatable=tuple(clashes))
        out.append(refused if clashes else t)
    return out
