"""What a task's code uses of Airflow that the bridge worker does not carry, read, not run.

The worker runs a task whose callable reads Airflow's context through its operator's
``execute`` with the worker's context (``bridge.worker.execution.template_context``: the
arguments in ``CARRIED_CONTEXT``, the run's XComs, the state stores), gives a mapped callable
the context arguments it names (``MAPPED_CONTEXT``) and calls a fenced one with its arguments
only. This module reads a callable's signature and source (its AST, and that of the same
module's functions it calls) and an operator's Jinja templates, and names each use of what the
worker does not carry with a one-line reason, so the inventory refuses the task before
anything runs.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from airflow.sdk.definitions.context import Context

RETURN_KEY = "return_value"
#: The construct of an ``async def`` callable.
ASYNC = "async def"
#: A generator callable: drained by its operator's execute (an unmapped, unfenced one).
GENERATOR = "generator"
#: What the task SDK injects into a callable by parameter name (the context's keys).
INJECTED = frozenset(Context.__annotations__) | {"templates_dict"}
#: The names the worker's template context holds (``template_context``'s keys).
WORKER_CONTEXT = frozenset(
    {
        "dag", "task", "ti", "task_instance", "run_id", "dag_run", "params", "logical_date",
        "ds", "ds_nodash", "ts", "ts_nodash", "ts_nodash_with_tz", "data_interval_start",
        "data_interval_end", "task_instance_key_str", "inlets", "outlets", "outlet_events",
        "inlet_events", "macros", "var", "conn", "map_index_template", "triggering_asset_events",
        "partition_key", "partition_date",
    }
)  # fmt: skip
#: What the worker's context holds but not as Airflow does: asset events are read from
#: Airflow's API (``inlet_events``), which a worker does not reach, and a bridge run was
#: triggered by no asset event (``triggering_asset_events``).
_NOT_CARRIED = frozenset({"inlet_events", "triggering_asset_events"})
#: What a callable run through its operator's execute is also given as in Airflow: the task's
#: state (the lease's, ``airflow_plugins.protection.task_state_store``), its assets' state
#: (``bridge.worker.asset_state``), and ``test_mode``, which Airflow's task runner leaves out of
#: the context (the argument keeps its default, in the worker too).
_STATE = frozenset({"task_state_store", "asset_state_store", "test_mode"})
#: The context arguments the worker gives a callable it runs through its operator's execute.
CARRIED_CONTEXT = (WORKER_CONTEXT - _NOT_CARRIED) | {"templates_dict"} | _STATE
#: The context arguments the worker passes each item of a mapped callable (it is called with
#: its arguments, not through its operator: no ``templates_dict`` to render).
MAPPED_CONTEXT = CARRIED_CONTEXT - {"templates_dict"}
#: The construct of a context argument a callable takes.
CONTEXT_ARGUMENT = "context argument"
#: A template reading the run's conf: carried from the Airflow run handed over.
DAG_RUN_CONF = "dag_run.conf"
#: What a task reads of the Airflow run handed over (``TaskSpec.reads_airflow_run``).
AIRFLOW_RUN_READS = frozenset({DAG_RUN_CONF})
#: Exceptions whose Airflow meaning (skip, reschedule, defer) the worker turns into a failure.
_SKIPS = {
    "AirflowSkipException": "skips itself: the workflow marks it skipped",
    "DownstreamTasksSkipped": "skips downstream tasks: the workflow skips them",
}
_NOT_FAILURES = {
    "AirflowRescheduleException": "Airflow reschedules the task",
    "TaskDeferred": "Airflow defers the task to a trigger",
}
_HELPER_DEPTH = 3


@dataclasses.dataclass(frozen=True)
class Use:
    """One construct a task uses that the worker does not run the same, and why."""

    construct: str
    reason: str
    #: the worker carries it when it runs the task through Airflow's own ``execute`` with the
    #: worker's context (``bridge.worker.execution``): no refusal, but the task runs that way
    carried: bool = False


def callable_uses(
    fn: Callable[..., Any],
    *,
    passed: Collection[str],
    wired: Collection[str] = (),
    task_id: str = "",
) -> list[Use]:
    """What ``fn`` uses of Airflow: refused (``carried`` False) or carried by running the task
    through its operator's ``execute`` with the worker's context (``carried`` True).

    Args:
        fn: the task's Python callable.
        passed: the parameter names the task's own arguments fill (the worker passes these).
        wired: the task ids whose XComs the worker passes it (its ancestors).
        task_id: the task's own id (it may pull its own pushes).
    """
    uses: list[Use] = []
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        uses.append(
            Use(
                ASYNC,
                "an async callable: its operator's execute runs the coroutine to completion in "
                "an event loop, as Airflow's task runner does",
                carried=True,
            )
        )
    if inspect.isgeneratorfunction(fn):
        uses.append(
            Use(
                GENERATOR,
                "a generator callable (yield): its operator's execute drains it as Airflow's "
                "does (create_executable_runner: Metadata into the outlet events, the return "
                "value its XCom)",
                carried=True,
            )
        )
    for param in inspect.signature(fn).parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            uses.append(Use(f"**{param.name}", "takes the whole context", carried=True))
            uses += _context_reads(fn, param.name)
        elif param.name in INJECTED and param.name not in passed:
            if param.name in CARRIED_CONTEXT:
                uses.append(Use(CONTEXT_ARGUMENT, param.name, carried=True))
            else:
                uses.append(
                    Use(
                        "context argument",
                        f"takes the context argument {param.name!r}, which the worker's context "
                        "lacks; pass the value as an argument",
                    )
                )
        elif (
            param.default is inspect.Parameter.empty
            and param.kind is not inspect.Parameter.VAR_POSITIONAL
            and param.name not in passed
        ):
            uses.append(
                Use(
                    "unfilled argument",
                    f"its argument {param.name!r} is not passed by the task: Airflow fills it "
                    "(the @asset decorator, the context), the worker cannot; pass it",
                )
            )
    for where, node in _source_nodes(fn, set(), 0):
        use = _node_use(node, wired={*wired, task_id})
        if use is not None:
            suffix = f" (in {where})" if where != fn.__name__ else ""
            uses.append(dataclasses.replace(use, reason=use.reason + suffix))
    return _unique(uses)


def _source_nodes(
    fn: Callable[..., Any], seen: set[types.CodeType], depth: int
) -> Iterator[tuple[str, ast.AST]]:
    """The AST nodes of ``fn`` and of the same module's plain functions it calls by name."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or code in seen or depth > _HELPER_DEPTH:
        return
    seen.add(code)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return  # no source to read (a lambda on a continued line, a built-in): signature only
    module_globals: Mapping[str, Any] = getattr(fn, "__globals__", {})
    for node in ast.walk(tree):
        yield fn.__name__, node
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            helper = module_globals.get(node.func.id)
            if isinstance(helper, types.FunctionType) and helper.__module__ == getattr(
                fn, "__module__", None
            ):
                yield from _source_nodes(helper, seen, depth + 1)


def _context_reads(fn: Callable[..., Any], name: str) -> list[Use]:
    """``name["x"]`` / ``name.get("x")`` reads of a ``**name`` context the worker's lacks."""
    uses: list[Use] = []
    for _, node in _source_nodes(fn, set(), _HELPER_DEPTH):  # the callable itself only
        key: ast.expr | None = None
        if isinstance(node, ast.Subscript) and _name(node.value) == name:
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and _name(node.func.value) == name
            and node.args
        ):
            key = node.args[0]
        read = _literal(key, "")
        if read and read in INJECTED and read not in CARRIED_CONTEXT:
            uses.append(
                Use(
                    "context variable",
                    f"reads {name}[{read!r}], which the worker's context lacks",
                )
            )
    return uses


def _node_use(node: ast.AST, *, wired: Collection[str]) -> Use | None:
    if isinstance(node, ast.Raise) and node.exc is not None:
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = _name(raised)
        if name in _SKIPS:
            return Use(name, _SKIPS[name], carried=True)
        if name in _NOT_FAILURES:
            return Use(
                name,
                f"raises {name}: {_NOT_FAILURES[name]}, the worker fails it (without retrying) "
                "and the downstream tasks do not run; return early instead",
            )
        return None
    if not isinstance(node, ast.Call):
        return None
    called = _name(node.func)
    if called == "get_current_context":
        return Use("get_current_context", "reads the current context", carried=True)
    if called == "xcom_push":
        return Use("xcom_push", "pushes an XCom", carried=True)
    if called == "xcom_pull":
        return _xcom_pull_use(node, wired)
    return None


def _xcom_pull_use(node: ast.Call, wired: Collection[str]) -> Use:
    if (
        _keyword(node, "dag_id")
        or _keyword(node, "run_id")
        or _keyword(node, "include_prior_dates")
    ):
        return Use(
            "xcom_pull other run",
            "pulls an XCom of another DAG or run: the worker carries XComs within one run",
        )
    ids = _keyword(node, "task_ids") or (node.args[0] if node.args else None)
    if ids is None:
        return Use("xcom_pull", "pulls its own XCom", carried=True)
    pulled = _literals(ids)
    if pulled is None:
        return Use(
            "xcom_pull task_ids",
            "pulls a computed task id: the inventory cannot check the worker passes it; "
            "name the task",
        )
    unwired = [t for t in pulled if t not in wired]
    if unwired:
        return Use(
            "xcom_pull task_ids",
            f"pulls {unwired[0]!r}, which is not upstream of it: the worker passes only its "
            "upstream tasks' XComs; make it an upstream",
        )
    return Use("xcom_pull", "pulls an upstream XCom", carried=True)


def template_uses(task: Any, *, wired: Collection[str]) -> list[Use]:
    """What an operator's templated fields read that the worker's rendering does not give.

    Args:
        task: the operator (run by ``execute`` in the worker).
        wired: the task ids whose return values the worker passes it (its ancestors).
    """
    try:
        env = task.get_template_env()
    except Exception:  # a task outside a DAG: Airflow's default environment
        import jinja2

        env = jinja2.Environment()
    known = (WORKER_CONTEXT - _NOT_CARRIED) | set(env.globals) | {"fence", "business_date"}
    uses: list[Use] = []
    for field in getattr(task, "template_fields", ()) or ():
        uses += _xcom_arg_uses(field, getattr(task, field, None), 0)
        for text in _strings(getattr(task, field, None), 0):
            source = _template_source(task, env, text)
            if source is None:
                continue
            tree = env.parse(source)
            uses += _xcom_uses(task, tree, wired)
            from jinja2 import meta, nodes

            for name in sorted(meta.find_undeclared_variables(tree) - known):
                uses.append(
                    Use(
                        "context variable",
                        f"its {field} reads {{{{ {name} }}}}, which the worker's template context "
                        "lacks",
                    )
                )
            for got in tree.find_all(nodes.Getattr):
                if got.attr == "conf" and isinstance(got.node, nodes.Name):
                    if got.node.name == "dag_run":
                        uses.append(
                            Use(
                                DAG_RUN_CONF,
                                f"its {field} reads dag_run.conf: the worker gives the conf of "
                                "the Airflow run handed over (AirflowRun)",
                                carried=True,
                            )
                        )
    return _unique(uses)


def _xcom_arg_uses(field: str, value: Any, depth: int) -> list[Use]:
    """XComArgs in an operator's field (``env={"X": t.output}``) the worker cannot resolve."""
    if depth > 5:
        return []
    if hasattr(value, "operator") and hasattr(value, "key"):
        producer = value.operator
        # a mapped task's output is its list of results (bridge.worker.execution resolves it);
        # one in a mapped task group is a list per group index, which the bridge does not run
        in_group = is_mapped(producer) and not getattr(producer, "is_mapped", False)
        if in_group:
            return [
                Use(
                    "mapped results",
                    f"its {field} takes {producer.task_id!r}'s results in a mapped task group: "
                    "the bridge maps single tasks only",
                )
            ]
        return []
    items: list[Any] = []
    if isinstance(value, Mapping):
        items = list(value.values())
    elif isinstance(value, list | tuple | set):
        items = list(value)
    return [use for item in items for use in _xcom_arg_uses(field, item, depth + 1)]


def _template_source(task: Any, env: Any, text: str) -> str | None:
    """The Jinja source of a templated value: the string, or the file it names."""
    if text.strip().endswith(tuple(getattr(task, "template_ext", ()) or ())):
        try:
            return str(env.loader.get_source(env, text.strip())[0])
        except Exception:
            return None  # not found here: Airflow renders it as a plain string then
    return text if ("{{" in text or "{%" in text) else None


def _xcom_uses(task: Any, tree: Any, wired: Collection[str]) -> list[Use]:
    from jinja2 import nodes

    uses: list[Use] = []
    for call in tree.find_all(nodes.Call):
        attr = getattr(call.node, "attr", None)
        if attr != "xcom_pull":
            continue  # a push is carried: the worker hands it to the downstream tasks
        kwargs = {k.key: k.value for k in call.kwargs}
        if "dag_id" in kwargs or "run_id" in kwargs or "include_prior_dates" in kwargs:
            uses.append(
                Use(
                    "xcom_pull other run",
                    "a template pulls an XCom of another DAG or run: the worker carries XComs "
                    "within one run",
                )
            )
        ids_node = kwargs.get("task_ids", call.args[0] if call.args else None)
        uses += _pulled_ids(task, ids_node, wired)
    return uses


def _pulled_ids(task: Any, ids_node: Any, wired: Collection[str]) -> list[Use]:
    from jinja2 import nodes

    if ids_node is None:
        return []  # its own task's XCom
    if isinstance(ids_node, nodes.Const) and isinstance(ids_node.value, str):
        ids = [ids_node.value]
    elif isinstance(ids_node, nodes.List | nodes.Tuple) and all(
        isinstance(i, nodes.Const) for i in ids_node.items
    ):
        ids = [str(getattr(i, "value", "")) for i in ids_node.items]
    else:
        return [
            Use(
                "xcom_pull task_ids",
                "a template pulls a computed task id: the inventory cannot check the worker "
                "passes it; name the task",
            )
        ]
    uses: list[Use] = []
    dag_tasks: Mapping[str, Any] = getattr(getattr(task, "dag", None), "task_dict", {}) or {}
    for task_id in ids:
        if task_id != task.task_id and task_id not in wired:
            uses.append(
                Use(
                    "xcom_pull task_ids",
                    f"a template pulls {task_id!r}, which is not upstream of it: the worker "
                    "passes only its upstream tasks' results; make it an upstream",
                )
            )
        elif task_id in dag_tasks and is_mapped(dag_tasks[task_id]):
            uses.append(
                Use(
                    "xcom_pull mapped",
                    f"a template pulls mapped task {task_id!r}: the worker's pull gives its "
                    "whole list and ignores map_indexes; pass the task's output instead",
                )
            )
    return uses


def is_mapped(task: Any) -> bool:
    """True for a mapped task or a task inside a mapped task group."""
    if "MappedOperator" in {c.__name__ for c in type(task).__mro__}:
        return True
    closest = getattr(task, "get_closest_mapped_task_group", None)
    return callable(closest) and closest() is not None


def _strings(value: Any, depth: int) -> Iterator[str]:
    if depth > 5:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item, depth + 1)
    elif isinstance(value, list | tuple | set):
        for item in value:
            yield from _strings(item, depth + 1)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _keyword(node: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in node.keywords if k.arg == name), None)


def _literals(node: ast.expr) -> list[str] | None:
    """The task ids a literal ``task_ids`` names (None when computed)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple):
        found = [_literal(item, "") for item in node.elts]
        return found if all(found) else None
    return None


def _literal(node: ast.expr | None, default: str = "<computed>") -> str:
    if node is None:
        return default
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return "<computed>"


def _unique(uses: list[Use]) -> list[Use]:
    return list(dict.fromkeys(uses))
