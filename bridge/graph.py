"""Checks a DAG spec's graph before anything runs, and orders it."""

from __future__ import annotations

from typing import Any

from bridge.spec import UPSTREAM_MARKER, DagSpec, TaskSpec


def graph_problems(spec: DagSpec) -> list[str]:
    """What makes the graph unrunnable: duplicates, unknown upstreams, cycles, bad mapping."""
    problems: list[str] = []
    seen: set[str] = set()
    for task in spec.tasks:
        if task.task_id in seen:
            problems.append(f"task {task.task_id!r} appears twice")
        seen.add(task.task_id)
    for task in spec.tasks:
        problems += _task_problems(task, seen)
    if not problems and len(topological(spec)) != len(spec.tasks):
        problems.append("the task graph has a cycle")
    return problems


def _task_problems(task: TaskSpec, ids: set[str]) -> list[str]:
    """What names a task the graph lacks, or a result that is not upstream of ``task``."""
    name = repr(task.task_id)
    problems = [
        f"task {name} depends on unknown task {up!r}" for up in task.upstream if up not in ids
    ]
    problems += [f"task {name} has unknown setup {s!r}" for s in task.setups if s not in ids]
    problems += [
        f"task {name} uses the result of {ref!r} not upstream"
        for ref in referenced(task)
        if ref not in task.upstream
    ]
    over: set[str] = set()
    if task.map_over is not None:
        over.add(task.map_over)
    _collect([*(source for _, source in task.expand), task.expand_kwargs], over)
    problems += [
        f"task {name} is mapped over {ref!r} not upstream"
        for ref in sorted(over - set(task.upstream))
    ]
    return problems


def shadow_refusals(spec: DagSpec) -> list[str]:
    """Tasks that may not run in shadow: effects outside a fence and not declared free of them."""
    return [
        f"{t.task_id}: writes outside a fence (tag the DAG side-effect-free:{t.task_id} if it "
        "has no effect, or make it a protected task with a sink)"
        for t in spec.tasks
        if not t.fenced and not t.side_effect_free and t.kind != "noop"
    ]


def topological(spec: DagSpec) -> list[TaskSpec]:
    """The tasks, each after its upstreams (stable: spec order among ready tasks)."""
    done: set[str] = set()
    order: list[TaskSpec] = []
    pending = list(spec.tasks)
    while pending:
        ready = [t for t in pending if all(u in done for u in (*t.upstream, *t.setups))]
        if not ready:
            break
        for task in ready:
            order.append(task)
            done.add(task.task_id)
        pending = [t for t in pending if t.task_id not in done]
    return order


def direct_upstream(task: TaskSpec) -> tuple[str, ...]:
    """The task's direct upstream tasks (its trigger rule is decided on them)."""
    return task.upstream if task.direct is None else task.direct


def run_state_tasks(spec: DagSpec) -> set[str]:
    """The tasks whose states decide the run's, as Airflow's ``_tis_for_dagrun_state``.

    The leaves, where a teardown without ``on_failure_fail_dagrun`` does not count: a task whose
    only downstreams are such teardowns is a leaf, and such a teardown is none. A DAG of those
    teardowns alone falls back to the tasks without downstreams.
    """
    downstream: dict[str, set[str]] = {t.task_id: set() for t in spec.tasks}
    for task in spec.tasks:
        for up in direct_upstream(task):
            downstream[up].add(task.task_id)
    counted = {t.task_id for t in spec.tasks if not t.is_teardown or t.on_failure_fail_dagrun}
    leaves = {t for t in counted if not downstream[t] & counted}
    return leaves or {t for t, down in downstream.items() if not down}


def referenced(task: TaskSpec) -> set[str]:
    """Upstream tasks whose results appear in the task's arguments."""
    found: set[str] = set()
    _collect([*task.args, *task.kwargs.values()], found)
    return found


def _collect(value: Any, found: set[str]) -> None:
    if isinstance(value, dict):
        if set(value) == {UPSTREAM_MARKER}:
            found.add(str(value[UPSTREAM_MARKER]))
            return
        for item in value.values():
            _collect(item, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect(item, found)


def substitute(value: Any, results: dict[str, Any]) -> Any:
    """Replaces upstream markers in ``value`` with those tasks' results."""
    if isinstance(value, dict):
        if set(value) == {UPSTREAM_MARKER}:
            return results[str(value[UPSTREAM_MARKER])]
        return {k: substitute(v, results) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [substitute(v, results) for v in value]
    return value
