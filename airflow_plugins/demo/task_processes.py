"""Finding the operating-system processes that run one Airflow task instance.

With LocalExecutor the chain is: scheduler -> executor worker -> supervisor -> task process.
The task process titles itself ``airflow worker -- <task instance id>`` (Airflow 3's task
runner), so the id read from the metadata database identifies it; its parent is the supervisor,
and the scheduler that owns it is the first ancestor that is one of the stack's schedulers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import psutil
import psycopg


@dataclasses.dataclass(frozen=True)
class TaskProcesses:
    """The processes of one running try.

    Attributes:
        supervisor: pid of the supervisor (heartbeats to the api-server, kills the task).
        task: pid of the task process (runs the operator's ``execute``).
        scheduler: pid of the scheduler whose executor runs it (None if not one of ours).
        try_number: the try these processes run.
    """

    supervisor: int
    task: int
    scheduler: int | None
    try_number: int


def task_instance_id(
    metadata_dsn: str, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> tuple[str, int] | None:
    """The current id and try number of a task instance, or None."""
    with psycopg.connect(metadata_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT id::text, try_number FROM task_instance WHERE dag_id = %s AND run_id = %s "
            "AND task_id = %s AND map_index = %s",
            (dag_id, run_id, task_id, map_index),
        ).fetchone()
    return (str(row[0]), int(row[1])) if row else None


def find_task_processes(
    metadata_dsn: str,
    dag_id: str,
    run_id: str,
    task_id: str,
    *,
    map_index: int = -1,
    scheduler_pids: Iterable[int] = (),
) -> TaskProcesses | None:
    """The processes running the current try of a task instance, or None when none runs."""
    found = task_instance_id(metadata_dsn, dag_id, run_id, task_id, map_index)
    if found is None:
        return None
    ti_id, try_number = found
    title = f"airflow worker -- {ti_id}"
    schedulers = set(scheduler_pids)
    for proc in psutil.process_iter(["pid", "cmdline", "ppid"]):
        cmdline: Any = proc.info.get("cmdline") or []
        if title not in " ".join(cmdline):
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            owner = next((p.pid for p in proc.parents() if p.pid in schedulers), None)
        except psutil.NoSuchProcess:
            continue
        return TaskProcesses(int(proc.info["ppid"]), int(proc.info["pid"]), owner, try_number)
    return None


def pids_alive(pids: Iterable[int]) -> list[int]:
    """The pids of ``pids`` that still exist and are not zombies."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive
