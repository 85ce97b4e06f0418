"""The cluster policy: zero-code protection for the tasks of DAGs that opt in.

Registered through the ``airflow.policy`` entry point, so ``pip install`` is all it takes. A
DAG opts in at parse time with the tag ``[exactly_once] opt_in_tag`` (``exactly-once`` by
default); a run's conf cannot turn it off, because the policy runs when the DAG file is parsed,
by the dag processor and again in the worker that runs the task. A wrapped task gets one holder
per key, skip-if-succeeded and self-fencing, but no sink fencing (``task_policy`` says what is
wrapped and what that gives); ``ExactlyOnceOperator`` / ``@exactly_once_task`` with
``sink_conn_id`` give the fence too.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow.policies import hookimpl

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection import config, connection_warmup, protected_try, task_state_store
from airflow_plugins.protection.protected_try import Protection

log = logging.getLogger(__name__)

RESUME_METHOD = "exactly_once_resume"
HANDOVER_RESUME_METHOD = "resume_handover"  # what routing.EngineHandover implementations defer to
WRAPPED_MARK = "_exactly_once_wrapped"

_running_task: Any = None


def opted_in(dag: Any) -> bool:
    """Whether a parsed DAG opted in (its tags hold ``[exactly_once] opt_in_tag``)."""
    return dag is not None and config.opt_in_tag() in set(getattr(dag, "tags", None) or ())


def is_wrapped(task: Any) -> bool:
    """Whether the policy wrapped ``task``."""
    return bool(getattr(task, WRAPPED_MARK, False))


def _wrappable(task: Any) -> bool:
    # imported here, not at module level: Airflow loads policy entry points while it is still
    # initialising itself
    from airflow.providers.standard.operators.bash import BashOperator
    from airflow.providers.standard.operators.python import PythonOperator

    return isinstance(task, PythonOperator | BashOperator) or task_state_store.is_durable_operator(
        task
    )


def self_fence(fence: Fence, reason: str) -> None:
    """Kills the task's work when its lease is lost: the shell of a BashOperator, then the
    task's own process group (Airflow starts each task process as a group leader)."""
    log.error("exactly-once: lease %s lost (%s): killing the task's processes", fence.key, reason)
    hook = getattr(_running_task, "subprocess_hook", None)
    shell = getattr(hook, "sub_process", None)
    if shell is not None and shell.poll() is None:
        try:
            os.killpg(os.getpgid(shell.pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    else:  # not a group leader (run outside Airflow's supervisor): only this process
        os.kill(os.getpid(), signal.SIGKILL)


def _protection() -> Protection:
    return Protection(resume_method=RESUME_METHOD, on_lost=self_fence)


def _body(task: Any, context: Mapping[str, Any]) -> Callable[[Fence], Any]:
    def run(fence: Fence) -> Any:
        return type(task).execute(task, context)

    return run


def _execute(context: Mapping[str, Any]) -> Any:
    """The wrapped ``execute``: ``context["task"]`` is the task copy Airflow runs."""
    global _running_task
    task = context["task"]
    _running_task = task
    return protected_try.run_try(task, context, _protection(), _body(task, context))


def _render(
    parent: Any,
    template_fields: Iterable[str],
    context: Mapping[str, Any],
    jinja_env: Any,
    seen_oids: set[int],
) -> None:
    """The wrapped template rendering: Airflow's, then the try's acquire starts early."""
    task = context["task"]
    type(task)._do_render_template_fields(
        task, parent, template_fields, context, jinja_env, seen_oids
    )
    if parent is task:
        protected_try.start_early(task, context, _protection())


def _resume(context: Mapping[str, Any], event: Any = None) -> Any:
    if isinstance(event, Mapping) and event.get("status") == "error":
        from airflow.sdk.exceptions import AirflowException

        raise AirflowException(f"exactly-once: waiting failed: {event.get('error')}")
    return _execute(context)


def _resume_handover(context: Mapping[str, Any], event: Any = None) -> Any:
    return protected_try.resume_handover(context["task"], context, _protection(), event)


def _on_kill() -> None:
    # A wrapped body is plain code: it cannot be told to stop and writes on until this process
    # dies (Airflow's SIGKILL comes 5 s after its SIGTERM). Releasing the lease here would let
    # the next try in beside it (10-16 customers were charged twice when the scheduler died),
    # so the lease is kept, to expire and be taken over (audited), and the body is ended
    # now with the task's process group: self-fencing.
    task = _running_task
    if task is not None:
        type(task).on_kill(task)
    fence = protected_try.active_fence()
    if protected_try.stop_active_try("task killed (on_kill)", release=False) and fence:
        self_fence(fence, "task killed (on_kill)")


def _given(task: Any, name: str) -> bool:
    """Whether the DAG author set ``name`` on the task (or in the DAG's ``default_args``)."""
    given = getattr(task, "partial_kwargs", None)  # a mapped task's arguments
    if not isinstance(given, dict):
        given = getattr(task, "_BaseOperator__init_kwargs", None) or {}
    return name in given


def _protected_retries(task: Any) -> None:
    """The protected defaults (5 attempts, exponential backoff) unless the author chose."""
    from airflow_plugins.protection.operators import DEFAULT_BACKOFF, DEFAULT_RETRIES

    if not _given(task, "retries"):
        task.retries = DEFAULT_RETRIES
    if not _given(task, "retry_exponential_backoff"):
        task.retry_exponential_backoff = DEFAULT_BACKOFF


def wrap(task: Any) -> None:
    """Wraps one task's ``execute``, deferral resume and ``on_kill`` with the lease."""
    task.execute = _execute
    task._do_render_template_fields = _render
    setattr(task, RESUME_METHOD, _resume)
    setattr(task, HANDOVER_RESUME_METHOD, _resume_handover)
    task.on_kill = _on_kill
    setattr(task, WRAPPED_MARK, True)
    _protected_retries(task)


def wrap_mapped(mapped: Any) -> None:
    """Wraps a mapped task: each instance Airflow unmaps to run is wrapped as it is made.

    The task runner unmaps the ``MappedOperator`` it parsed (``render_template_fields``), so
    the parsed object's ``unmap`` is where every running instance passes.
    """
    unmap = mapped.unmap

    def unmap_wrapped(resolve: Any) -> Any:
        task = unmap(resolve)
        wrap(task)
        return task

    mapped.unmap = unmap_wrapped
    setattr(mapped, WRAPPED_MARK, True)
    _protected_retries(mapped)


def _wrappable_mapped(task: Any) -> bool:
    from airflow.providers.standard.operators.bash import BashOperator
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    operator_class = getattr(task, "operator_class", None)
    return (
        isinstance(task, MappedOperator)
        and isinstance(operator_class, type)
        and issubclass(operator_class, PythonOperator | BashOperator | _durable_base())
    )


def _durable_base() -> type:
    try:
        from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
    except ImportError:  # an Airflow before 3.3
        return _NoDurableBase
    return ResumableJobMixin


class _NoDurableBase:
    """No operator is one of these: the durable base where Airflow has none."""


def _protected_operator(task: Any) -> bool:
    from airflow_plugins.protection.operators import ExactlyOnceOperator

    operator_class = getattr(task, "operator_class", None)  # a mapped task's operator
    return isinstance(task, ExactlyOnceOperator) or (
        isinstance(operator_class, type) and issubclass(operator_class, ExactlyOnceOperator)
    )


def _own_lease_conn_id(task: Any) -> str | None:
    partial = getattr(task, "partial_kwargs", None)  # a mapped task's arguments
    given = partial.get("lease_conn_id") if isinstance(partial, dict) else None
    return getattr(task, "lease_conn_id", None) or given or None


@hookimpl
def task_policy(task: Any) -> None:
    """Wraps the tasks of opted-in DAGs; warms the lease store for a protected task.

    A wrapped ``PythonOperator``, ``@task``, ``BashOperator`` or durable operator (Airflow
    3.3's ``ResumableJobMixin``: its job is submitted once per business key and re-attached to
    by later tries and runs, ``airflow_plugins.protection.task_state_store``) gets:

    - one holder per key (``dag/task/business_date``): a second try, a cleared task or a second
      DAG run of the same business date waits (deferred) while the first holds the lease;
    - skip-if-succeeded: once the key succeeded, later tries return the recorded result;
    - self-fencing: when the lease cannot be renewed (taken over, released, store unreachable
      past the TTL), the task's process group, and a BashOperator's shell, are killed with
      SIGKILL.

    It cannot get sink fencing: its writes carry no token, so a process paused (SIGSTOP) past
    its lease and resumed can still write before its keeper notices. The policy logs a warning
    for each wrapped task. A mapped task (``.expand``) is wrapped when it has a
    ``map_index_template`` (each instance is keyed on it: a tenant id, not a position); without
    one it is left unprotected, with a warning. Other operators are left as they are, with a
    warning.

    In the task process about to run a protected task (an ``ExactlyOnceOperator``, an
    ``@exactly_once_task`` or a task wrapped here), it also starts warming that task's lease
    store (``airflow_plugins.protection.connection_warmup``), since the policy is the first
    plugin code to see the task there.
    """
    if _protected_operator(task):
        if connection_warmup.runs_here(task):
            connection_warmup.start(task, _own_lease_conn_id(task))
        return
    dag = getattr(task, "dag", None)
    if not opted_in(dag) or is_wrapped(task):
        return
    where = f"{getattr(dag, 'dag_id', '?')}.{task.task_id}"
    if _wrappable_mapped(task):
        if not task.map_index_template:
            log.warning(
                "exactly-once policy: %s is a mapped task without a map_index_template and is "
                "NOT protected: name each instance (e.g. map_index_template='{{ tenant }}')",
                where,
            )
            return
        wrap_mapped(task)
    elif _wrappable(task):
        wrap(task)
    else:
        log.warning(
            "exactly-once policy: %s (%s) is not a Python, Bash or durable task and is NOT "
            "protected",
            where,
            type(task).__name__,
        )
        return
    if connection_warmup.runs_here(task):
        connection_warmup.start(task)
    log.warning(
        "exactly-once policy: %s wrapped: one holder per key, skip-if-succeeded and "
        "self-fencing, but it uses no fence: its writes carry no token, so a sink cannot refuse "
        "a superseded writer (use @exactly_once_task with sink_conn_id for that)",
        where,
    )
