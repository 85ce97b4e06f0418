"""Warms the lease store while Airflow is still preparing a protected task.

A task process starts cold: its first lease call would open a Postgres connection (a new
server backend) and plan the try's statements in it before the body could start. Airflow parses
the DAG file in the task process first, and the cluster policy sees the task then
(``get_parsing_context()`` names it): for a protected task, ``start`` opens the store's
connection, runs ``LeaseStore.warm_up`` (nothing is written) and reads the plugin's options on
a daemon thread, beside the rest of Airflow's preparation. It also records which task this
process was started for (``preparing``): only there does the early acquire start. Nothing
happens in the dag processor, for other tasks, or with ``enabled = False``; a failure is only
logged (the try's own acquire connects and decides, deferring while the store is unreachable).
"""

from __future__ import annotations

import _thread
import logging
import threading
from typing import Any

from airflow_plugins.protection import config

log = logging.getLogger(__name__)

_started = False
_task: tuple[str, str] | None = None  # (dag id, task id) this process was started to run
_lock = threading.Lock()


def runs_here(task: Any) -> bool:
    """Whether this process parsed the DAG file to run ``task`` (a task runner's parse)."""
    from airflow.sdk import get_parsing_context

    context = get_parsing_context()
    dag = getattr(task, "dag", None)
    return (
        context.task_id is not None
        and context.task_id == getattr(task, "task_id", None)
        and context.dag_id == getattr(dag, "dag_id", None)
    )


def preparing(dag_id: str, task_id: str) -> bool:
    """Whether this process is a task runner's, started to run that task (see ``start``)."""
    return _task == (dag_id, task_id)


def start(task: Any, conn_id: str | None = None) -> bool:
    """Starts warming the lease store of this process's protected task (once per process).

    One thread resolves the store, opens and prepares its connection and reads the options.
    It is started without waiting for it to run (``threading.Thread.start`` waits, a
    millisecond or more on a busy host, and the parse is on the task's path).

    Args:
        task: the task this process parsed its DAG file to run (``runs_here``).
        conn_id: the task's own lease-store Connection (None: the configured store).

    Returns:
        Whether it started now (False: started before, or protection is off).
    """
    global _started, _task
    with _lock:
        if _started or not config.enabled():
            return False
        _started = True
        _task = (task.dag.dag_id, task.task_id)
    _thread.start_new_thread(_warm, (conn_id,))
    return True


def _warm(conn_id: str | None) -> None:
    try:
        config.task_lease_store(conn_id).warm_up()
        config.preload()
    except Exception as exc:  # the try's own acquire reports what is wrong
        log.info("exactly-once: warming the lease store failed: %s", exc)
