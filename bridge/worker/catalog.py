"""Where a worker finds the code of a task: registered, importable, or in its DAG folder.

A task's code is not shipped through Temporal. The worker runs the same code Airflow runs: a
callable imported by ``module:qualname``, or the task itself found in the worker's DAG folder
(the same files the dag-processor parses), so ``@task`` and PythonOperator code runs unchanged;
other operators are rebuilt from there (a fresh copy per run) and run by
``bridge.worker.execution``.
"""

from __future__ import annotations

import copy
import importlib
import os
import threading
from collections.abc import Callable
from typing import Any

from bridge.spec import TaskSpec


class TaskCodeNotFound(LookupError):
    """The worker has no code for a task (not registered, not importable, not in its DAGs)."""


class TaskCatalog:
    """Resolves tasks to callables on a worker.

    Args:
        dags_folder: a folder of Airflow DAG files to find tasks in (needs Airflow installed),
            or several joined by ``os.pathsep`` (``BRIDGE_DAGS_FOLDER=/a:/b``); a DAG id found
            in two folders is taken from the first.
    """

    def __init__(self, dags_folder: str | None = None) -> None:
        self._registered: dict[tuple[str, str], Callable[..., Any]] = {}
        self._dags_folder = dags_folder
        self._dags: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def register(self, dag_id: str, task_id: str, fn: Callable[..., Any]) -> None:
        """Registers the code of one task (for DAGs written for the bridge, and tests)."""
        self._registered[(dag_id, task_id)] = fn

    def load(self) -> None:
        """Parses the DAG folder now (call it on the main thread: Airflow's parser times
        imports out with SIGALRM, which only the main thread can use). New DAG files are picked
        up by restarting the worker."""
        if self._dags_folder is None:
            return
        with self._lock:
            if self._dags is None:
                from airflow.dag_processing.dagbag import DagBag

                dags: dict[str, Any] = {}
                for folder in reversed(self._dags_folder.split(os.pathsep)):
                    if folder:
                        dags.update(DagBag(folder, safe_mode=False).dags)
                self._dags = dags

    def resolve(self, dag_id: str, spec: TaskSpec) -> Callable[..., Any]:
        """The callable that runs ``spec``: called with its resolved args and kwargs.

        Raises:
            TaskCodeNotFound: nowhere to find it.
        """
        found = self._registered.get((dag_id, spec.task_id))
        if found is not None:
            return found
        if spec.callable_ref:
            return import_callable(spec.callable_ref)
        return self._from_dags(dag_id, spec)

    def dag(self, dag_id: str) -> Any:
        """The parsed DAG ``dag_id`` of the DAG folder (None when it is not there)."""
        if self._dags_folder is None:
            return None
        self.load()
        with self._lock:
            return (self._dags or {}).get(dag_id)

    def operator(self, dag_id: str, task_id: str) -> Any:
        """A fresh copy of the operator ``task_id`` of ``dag_id`` from the DAG folder (rendering
        templates mutates an operator, and one worker runs many business runs at once).

        Raises:
            TaskCodeNotFound: no DAG folder, the task is not in it, or it cannot be copied.
        """
        if self._dags_folder is None:
            raise TaskCodeNotFound(
                f"{dag_id}.{task_id}: an operator runs from the worker's DAG folder, and this "
                "worker has none (set BRIDGE_DAGS_FOLDER)"
            )
        dag = self.dag(dag_id)
        if dag is None or task_id not in dag.task_dict:
            raise TaskCodeNotFound(f"{dag_id}.{task_id} is not in {self._dags_folder}")
        try:
            return copy.deepcopy(dag.task_dict[task_id])
        except Exception as exc:
            raise TaskCodeNotFound(f"{dag_id}.{task_id} cannot be rebuilt: {exc}") from exc

    def _from_dags(self, dag_id: str, spec: TaskSpec) -> Callable[..., Any]:
        if self._dags_folder is None:
            raise TaskCodeNotFound(
                f"{dag_id}.{spec.task_id}: no registered code, no callable_ref, and the worker "
                "has no DAG folder (set BRIDGE_DAGS_FOLDER)"
            )
        self.load()
        with self._lock:
            dag = (self._dags or {}).get(dag_id)
        if dag is None or spec.task_id not in dag.task_dict:
            raise TaskCodeNotFound(f"{dag_id}.{spec.task_id} is not in {self._dags_folder}")
        task = dag.task_dict[spec.task_id]
        python_callable = getattr(task, "python_callable", None)
        if python_callable is not None:
            # @exactly_once_task shows Airflow a fence-less wrapper; run the function itself
            original = getattr(python_callable, "_exactly_once_original", python_callable)
            return original  # type: ignore[no-any-return]

        def execute(*args: Any, **kwargs: Any) -> Any:
            return task.execute(context={"business_date": kwargs.get("business_date")})

        return execute


def import_callable(ref: str) -> Callable[..., Any]:
    """Imports ``module:qualname``.

    Raises:
        TaskCodeNotFound: it cannot be imported or is not callable.
    """
    module_name, _, qualname = ref.partition(":")
    if not module_name or not qualname:
        raise TaskCodeNotFound(f"{ref!r} is not module:qualname")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise TaskCodeNotFound(f"cannot import {ref!r}: {exc}") from exc
    if not callable(target):
        raise TaskCodeNotFound(f"{ref!r} is not callable")
    # a decorated @task function: run the function it wraps
    target = getattr(target, "function", target)
    return getattr(target, "_exactly_once_original", target)  # type: ignore[no-any-return]
