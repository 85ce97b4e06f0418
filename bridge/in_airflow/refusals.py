"""What Airflow does around a task, or how it runs it, that the bridge worker does not do.

The kinds of task the worker cannot run the same (sensors without a poke, deferrables,
cross-DAG operators, mapped setups/teardowns, trigger rules it does not decide),
what Airflow runs around a task's code (a mapped task's pre/post-execute hooks, callbacks,
depends_on_past) and
callables Airflow runs somewhere other than in-process (a mapped ``@task.bash`` or
``@task.virtualenv``, ``@task.docker``, ...). ``translate`` refuses them by name; ``code_use``
reads what the code itself uses.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bridge.in_airflow.code_use import Use, callable_uses, is_mapped
from bridge.trigger_rules import RULES

_CROSS_DAG = {"TriggerDagRunOperator", "ExternalTaskMarker", "ExternalTaskSensor"}
#: Operators that skip downstream tasks: run through their execute, the workflow skips them.
SKIPPING = {"BaseBranchOperator", "BranchMixIn", "ShortCircuitOperator", "SkipMixin"}
#: What decides from the Airflow run's type and data interval and the DAG's timetable: its
#: own ``choose_branch`` runs in the worker with the Airflow run handed over (``AirflowRun``).
AIRFLOW_RUN_STATE = {"LatestOnlyOperator"}
LATEST_ONLY = "latest only"
#: A pre/post-execute hook: run around the operator's execute in the worker, as Airflow does.
HOOKS = "run_if/skip_if/pre_execute"
IN_PROCESS = {"PythonOperator", "ExactlyOnceOperator"}  # what the worker runs by calling it
#: Operators whose execute runs the callable in a virtualenv it builds or another interpreter
#: (``@task.virtualenv``, ``@task.external_python`` and their branch variants): the worker runs
#: that execute, which does there what Airflow's worker does.
OWN_ENVIRONMENT = {"PythonVirtualenvOperator", "ExternalPythonOperator"}
_CALLBACKS = (
    "on_execute_callback",
    "on_success_callback",
    "on_failure_callback",
    "on_retry_callback",
    "on_skipped_callback",
)


class NotTranslatable(Exception):
    """Why a task does not translate: one construct, or several ``uses``."""

    def __init__(self, reason: str, construct: str = "", uses: Sequence[Use] = ()) -> None:
        super().__init__(reason)
        self.uses = tuple(uses) or (Use(construct, reason),)


def class_names(task: Any) -> set[str]:
    """The class names of a task's MRO, and of its operator class when it is mapped."""
    names = {cls.__name__ for cls in type(task).__mro__}
    operator_class = getattr(task, "operator_class", None)  # a mapped task's operator
    if isinstance(operator_class, type):
        names |= {cls.__name__ for cls in operator_class.__mro__}
    return names


def refuse_kinds(task: Any, partial: Mapping[str, Any]) -> None:
    """Refuses a kind of task the worker does not run the same.

    Raises:
        NotTranslatable: with the construct and the reason.
    """
    names = class_names(task)
    if names & _CROSS_DAG:
        raise NotTranslatable(
            "cross-DAG operator: keep the chain in Airflow (see MIGRATION.md, chains)", "cross-DAG"
        )
    if "BaseSensorOperator" in names:
        _refuse_sensor(task)
    elif getattr(task, "deferrable", False) or getattr(task, "start_from_trigger", False):
        raise NotTranslatable(
            "deferrable: it waits on an Airflow trigger, which Temporal lacks", "deferrable"
        )
    if (getattr(task, "is_setup", False) or getattr(task, "is_teardown", False)) and is_mapped(
        task
    ):
        raise NotTranslatable(
            "a mapped setup/teardown: Airflow counts each of its items' states in the setup "
            "rules, the workflow has one outcome for the mapped task",
            "mapped setup/teardown",
        )
    rule = trigger_rule(task)
    if rule not in RULES:
        raise NotTranslatable(f"trigger rule {rule!r} is not translated", "trigger rule")
    _refuse_semantics(task, partial)


def _refuse_sensor(task: Any) -> None:
    """A sensor the workflow cannot wait for: one without a condition of its own to poke, one
    Airflow starts from its trigger, a mapped one."""
    if is_mapped(task):
        raise NotTranslatable(
            "a mapped sensor: the workflow waits for single sensors only", "mapped sensor"
        )
    if getattr(task, "start_from_trigger", False):
        raise NotTranslatable(
            "start_from_trigger: Airflow runs only its trigger, in the triggerer, which "
            "Temporal lacks",
            "deferrable",
        )
    own_poke = any(
        "poke" in vars(c) for c in type(task).__mro__ if c.__name__ != "BaseSensorOperator"
    )
    if not own_poke:
        raise NotTranslatable(
            f"a sensor without a poke of its own ({type(task).__name__} waits in its execute or "
            "its trigger): the workflow has no condition to poke between its timers",
            "sensor",
        )


def trigger_rule(task: Any) -> str:
    """The task's trigger rule's value (``all_success``, ...)."""
    rule = getattr(task, "trigger_rule", None) or "all_success"
    return str(getattr(rule, "value", rule)).rsplit(".", 1)[-1].lower()


def _refuse_semantics(task: Any, partial: Mapping[str, Any]) -> None:
    """What Airflow does around a task's code that the worker does not do."""

    def attr(name: str) -> Any:
        value = getattr(task, name, None)
        return partial.get(name) if value is None else value

    # a mapped task's hooks sit in its partial kwargs under their argument names
    hooked = attr("_pre_execute_hook") or attr("_post_execute_hook")
    hooked = hooked or partial.get("pre_execute") or partial.get("post_execute")
    if is_mapped(task) and hooked:
        raise NotTranslatable(
            "a mapped task's pre/post-execute hook (@task.run_if, @task.skip_if, pre_execute=): "
            "the worker calls a mapped callable with its arguments only, not through its "
            "operator's execute with the hooks around it; decide inside the callable",
            HOOKS,
        )
    hooked = next((c for c in _CALLBACKS if attr(c)), None)
    if hooked is not None:
        raise NotTranslatable(
            f"{hooked}: Airflow calls it, the worker does not; alert from Temporal instead",
            "callback",
        )
    if attr("retry_policy"):
        raise NotTranslatable(
            "a retry policy: Airflow decides per exception whether and when to retry, the "
            "workflow retries by retries / retry_delay only",
            "retry policy",
        )
    if attr("depends_on_past") or attr("wait_for_downstream"):
        raise NotTranslatable(
            "depends_on_past/wait_for_downstream: Airflow waits on the previous run's task, "
            "the workflow does not",
            "depends_on_past",
        )
    if is_mapped(task) and "MappedOperator" not in class_names(task):
        raise NotTranslatable(
            "in a mapped task group: the bridge maps single tasks only; map a @task instead",
            "mapped task group",
        )


def refuse_own_environment(task: Any, fn: Callable[..., Any] | None, names: set[str]) -> None:
    """Refuses a virtualenv / external-python callable whose run in the worker would differ
    (nothing for another operator).

    Its operator's execute writes the callable's source to a script and runs it in the other
    interpreter with the op_args / op_kwargs and the serializable context keys it names.
    Airflow gives that process its task supervisor's channel (Variables, Connections, XComs,
    ``get_current_context`` through the Airflow it imports); the worker's process has none.

    Raises:
        NotTranslatable: the callable imports Airflow, or uses what the worker does not carry.
    """
    if fn is None or not names & OWN_ENVIRONMENT:
        return
    args = list(getattr(task, "op_args", None) or ())
    positional = list(inspect.signature(fn).parameters)[: len(args)]
    passed = {*(getattr(task, "op_kwargs", None) or {}), *positional}
    wired = tuple(sorted(task.get_flat_relative_ids(upstream=True)))
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError) as exc:
        raise NotTranslatable(
            f"its callable's source cannot be read ({exc}): the operator runs that source",
            "own environment",
        ) from exc
    for node in ast.walk(tree):
        modules = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        if any(m == "airflow" or m.startswith("airflow.") for m in modules):
            raise NotTranslatable(
                "its callable imports Airflow in its own environment: in Airflow that process "
                "reaches Variables, Connections, XComs and the context through the task "
                "supervisor, which the worker's process does not have",
                "Airflow in own environment",
            )
    refused = [u for u in callable_uses(fn, passed=passed, wired=wired) if not u.carried]
    if refused:
        raise NotTranslatable(refused[0].reason, uses=refused)


def elsewhere(cls: str, names: set[str], *, mapped: bool = False) -> tuple[str, str]:
    """Why a callable that Airflow runs somewhere other than in-process is refused."""
    if mapped and names & OWN_ENVIRONMENT:
        return (
            f"a mapped {cls}: the worker maps plain callables, it would call the function "
            "in-process, not in its virtualenv or interpreter (an unmapped one runs through its "
            "operator's execute)",
            cls,
        )
    if "BashOperator" in names:
        return (
            "@task.bash: Airflow runs the command the function returns, the worker would call "
            "the function and never run bash; use BashOperator (its execute runs in the worker)",
            "@task.bash",
        )
    return (
        f"{cls} runs its callable in its own environment (a container, a pod, another language): "
        "the worker would call it in-process; refused rather than rebuilt: use @task in the "
        "worker's environment, or keep it in Airflow",
        cls,
    )
