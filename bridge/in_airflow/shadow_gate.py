"""Which tasks of a DAG Temporal runs in ``shadow``, and whether it may: the shadow gate.

``bridge mode set DAG shadow`` refuses, naming them, the tasks Temporal would run in shadow that
have an effect outside a fence and are not declared side-effect-free (a shadow must change
nothing and reach nobody; its fenced writes are captured and rolled back, the rest would run
for real). Every way to set a mode applies it through ``check_shadow``: the command line in its
own process, the plugin's ``/migration/mode`` page through ``bridge mode check`` in a child
process (``bridge.in_airflow.shadow_check``), so DAG code never runs in Airflow's api-server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from bridge.cutover import ModeChangeRefused
from bridge.graph import shadow_refusals
from bridge.in_airflow.refusals import NotTranslatable, class_names
from bridge.in_airflow.translate import declared_side_effect_free, task_spec, uninspectable
from bridge.spec import DagSpec, TaskSpec


def _passthrough(value: Any, _: Any) -> Any:
    return value  # the check reads what a task is, not what its templates render to


def _is_protected(task: Any) -> bool:
    """An ``ExactlyOnceOperator`` / ``@exactly_once_task`` task (also mapped): what the
    bridge's router hands to Temporal one task at a time."""
    operator_class = getattr(task, "operator_class", None)
    mapped = (
        {c.__name__ for c in operator_class.__mro__} if isinstance(operator_class, type) else set()
    )
    return "ExactlyOnceOperator" in class_names(task) | mapped


def _drivers_of(dag_id: str, dags: Iterable[Any]) -> list[tuple[Any, list[str] | None]]:
    """The ``BridgeOperator`` tasks (in any DAG of ``dags``) whose graph is ``dag_id``, each
    with the task ids it hands over (None: every task but itself)."""
    found: list[tuple[Any, list[str] | None]] = []
    for driver in dags:
        for task in driver.tasks:
            if "BridgeOperator" not in class_names(task):
                continue
            source = getattr(task, "source_dag", None)
            source_id = (
                source.dag_id if source is not None else getattr(task, "source_dag_id", None)
            ) or driver.dag_id
            if source_id == dag_id:
                found.append((task, getattr(task, "task_ids", None)))
    return found


def shadow_route(dag: Any, dags: Iterable[Any] = ()) -> str:
    """How Temporal gets ``dag``'s work in ``shadow``: ``bridge-operator`` (a driver DAG among
    ``dags`` hands its graph over); ``whole`` (protected tasks mixed with ordinary ones, every
    task fenced or declared side-effect-free: one shadow of the whole graph per business run,
    started from its root task); ``protected`` (the router shadows its protected tasks one by
    one: a DAG of protected tasks only, or one with an ordinary task that is not shadow-safe);
    ``none`` (an ordinary DAG: shadowed whole too, ``bridge.in_airflow.whole_shadow``)."""
    if _drivers_of(dag.dag_id, dags):
        return "bridge-operator"
    protected = [t for t in dag.tasks if _is_protected(t)]
    if not protected:
        return "none"
    drives = any("BridgeOperator" in class_names(t) for t in dag.tasks)  # its graph's mode counts
    if len(protected) < len(dag.tasks) and not drives and not _refusals(dag, list(dag.tasks)):
        return "whole"
    return "protected"


def shadowed_whole(dag: Any) -> bool:
    """Whether each business run of ``dag`` in ``shadow`` gets one Temporal shadow of its whole
    graph (an ordinary DAG, or a ``whole`` one) rather than per-task shadows or none."""
    return shadow_route(dag, [dag]) in ("none", "whole")


def shadow_tasks(dag: Any, dags: Iterable[Any] = ()) -> list[Any]:
    """The tasks of ``dag`` that Temporal runs when the DAG is in ``shadow`` mode.

    The graph of a ``BridgeOperator`` (found among ``dags``): the tasks the operator hands
    over. Else a ``protected`` route: its protected tasks (the router shadows them one by one;
    its other tasks run in Airflow only). Else every task (a whole-DAG shadow).
    """
    drivers = _drivers_of(dag.dag_id, dags)
    if drivers:
        wanted: set[str] = set()
        for driver, task_ids in drivers:
            wanted |= set(task_ids) if task_ids is not None else set(dag.task_ids)
            wanted.discard(driver.task_id)
        return [t for t in dag.tasks if t.task_id in wanted]
    if shadow_route(dag, dags) == "protected":
        return [t for t in dag.tasks if _is_protected(t)]
    return list(dag.tasks)


def shadow_refusals_of(dag: Any, dags: Iterable[Any] = ()) -> list[str]:
    """Why ``dag`` may not go to ``shadow``: each task Temporal would run in shadow
    (``shadow_tasks``) that has an effect outside a fence and is not declared side-effect-free
    (tag ``side-effect-free`` or ``side-effect-free:<task_id>``), or cannot run in Temporal,
    named with the reason. Empty: the shadow runs without effects."""
    return _refusals(dag, shadow_tasks(dag, dags))


def _refusals(dag: Any, tasks: list[Any]) -> list[str]:
    specs: list[TaskSpec] = []
    refused: list[str] = []
    for task in tasks:
        free = declared_side_effect_free(dag, task.task_id)
        try:
            specs.append(task_spec(task, side_effect_free=free, render=_passthrough))
        except NotTranslatable as exc:
            refused.append(f"{task.task_id}: cannot run in Temporal ({exc})")
        except Exception as exc:  # refused, never a traceback: it cannot be shown shadow-safe
            reason = uninspectable(task.task_id, type(task).__name__, exc).reason
            refused.append(f"{task.task_id}: {reason}")
    return refused + shadow_refusals(DagSpec(dag.dag_id, tuple(specs)))


def check_shadow(dag_id: str, dags: Mapping[str, Any], folder: str) -> str | None:
    """The shadow gate of ``dag_id`` among the DAGs of ``folder`` (``dags``: id -> DAG).

    Returns:
        A note for the user on how Temporal shadows the DAG when it is shadowed whole (an
        ordinary DAG, or protected tasks mixed with side-effect-free ones: the whole graph
        beside each Airflow run, ``bridge.in_airflow.whole_shadow``) or when only its
        protected tasks are (naming the tasks that keep it from a whole shadow), else None.

    Raises:
        ModeChangeRefused: the DAG is not among ``dags``, or Temporal would run some of its
            tasks with effects (each named with the reason).
    """
    dag = dags.get(dag_id)
    if dag is None:
        raise ModeChangeRefused(
            f"{dag_id} is not in the DAG folder {folder}: cannot tell which of its tasks "
            "Temporal would run in shadow (or --force)"
        )
    refusals = shadow_refusals_of(dag, dags.values())
    if refusals:
        raise ModeChangeRefused(
            f"{dag_id}: shadow refused, Temporal would run these tasks with effects: "
            + "; ".join(refusals)
        )
    route = shadow_route(dag, dags.values())
    if route == "none":
        return (
            f"{dag_id} has no protected task and no BridgeOperator hands it over: each of its "
            "Airflow runs starts a Temporal shadow of the whole DAG, compared task by task "
            "(the bridge's router must be installed; see MIGRATION.md, Shadow)"
        )
    if route == "whole":
        return (
            f"{dag_id} mixes protected tasks with side-effect-free ones: each of its Airflow "
            "runs starts one Temporal shadow of the whole DAG (protected tasks fenced), "
            "compared task by task (the bridge's router must be installed; see MIGRATION.md, "
            "Shadow)"
        )
    if route == "protected" and len(shadow_tasks(dag, dags.values())) < len(dag.tasks):
        unsafe = sorted({r.split(":")[0] for r in _refusals(dag, list(dag.tasks))})
        if not unsafe:  # e.g. it drives another DAG through a BridgeOperator
            return (
                f"{dag_id} is shadowed one protected task at a time (its other tasks run in "
                "Airflow only)"
            )
        return (
            f"{dag_id} is shadowed one protected task at a time ("
            + ", ".join(unsafe)
            + " would run with effects in a whole-DAG shadow; were they declared "
            "side-effect-free, the whole DAG would be shadowed)"
        )
    return None
