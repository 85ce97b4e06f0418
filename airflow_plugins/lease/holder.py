"""Who holds a lease: a structured identity, recorded on the lease and in every audit row."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
import sys
from typing import Any, Literal

Engine = Literal["airflow", "temporal", "process"]

# Names the executor worker a holder runs in, where the executor's own name cannot be seen (a
# Kubernetes pod's name through the downward API, a systemd unit); it wins over Celery's.
WORKER_ENV = "EXACTLY_ONCE_WORKER"


def executor_worker() -> str | None:
    """The name of the executor worker this process runs in, or None.

    Every Celery worker on one machine has the same host name, and a task re-delivered by the
    broker is the same try on another worker: the worker's node name (``worker-a@host``) tells
    the two holders apart in the audit trail. Airflow's Celery task forks the try's supervisor
    and the supervisor forks the task process (no exec on Linux), so the Celery task being
    executed is still in this process's memory; Celery is only looked up if it is already
    imported, never imported here. ``EXACTLY_ONCE_WORKER`` names the worker otherwise.
    """
    named = os.environ.get(WORKER_ENV)
    if named:
        return named
    state = sys.modules.get("celery._state")
    if state is None:
        return None
    try:
        task = state.get_current_task()
        hostname = getattr(getattr(task, "request", None), "hostname", None)
    except Exception:  # an identity hint must never break a lease call
        return None
    return str(hostname) if hostname else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Holder:
    """The identity of one execution that holds (or asks for) a lease.

    Airflow fills dag/run/task/map index/try; Temporal fills workflow/run/activity/attempt;
    any other Python service uses ``Holder.process``. Host and pid say where it runs, and
    ``worker`` which executor worker on that host (a Celery node name, see
    ``executor_worker``), so a re-delivered try shows as a new holder on another worker.
    """

    engine: Engine
    host: str = dataclasses.field(default_factory=socket.gethostname)
    pid: int = dataclasses.field(default_factory=os.getpid)
    worker: str | None = dataclasses.field(default_factory=executor_worker)
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None
    try_number: int | None = None
    workflow_id: str | None = None
    workflow_run_id: str | None = None
    activity_id: str | None = None
    attempt: int | None = None
    name: str | None = None

    @classmethod
    def airflow(
        cls, *, dag_id: str, run_id: str, task_id: str, map_index: int = -1, try_number: int
    ) -> Holder:
        """The holder for one try of an Airflow task instance."""
        return cls(
            engine="airflow",
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
            try_number=try_number,
        )

    @classmethod
    def temporal(
        cls, *, workflow_id: str, workflow_run_id: str, activity_id: str, attempt: int
    ) -> Holder:
        """The holder for one attempt of a Temporal activity."""
        return cls(
            engine="temporal",
            workflow_id=workflow_id,
            workflow_run_id=workflow_run_id,
            activity_id=activity_id,
            attempt=attempt,
        )

    @classmethod
    def process(cls, name: str) -> Holder:
        """The holder for a plain process (a script, a service, a test worker)."""
        return cls(engine="process", name=name)

    def to_json(self) -> dict[str, Any]:
        """The holder as stored: fields that are set, nothing else."""
        # not dataclasses.asdict: it deep-copies, and this runs on every lease call
        return {k: v for k in _field_order() if (v := getattr(self, k)) is not None}

    @functools.cached_property
    def json_text(self) -> str:
        """``to_json()`` as JSON text, serialised once per holder (sent on every lease call)."""
        # a cached_property writes the instance __dict__ directly, so a frozen holder keeps it
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Holder:
        """Reads a stored holder back; unknown fields are ignored."""
        names = _field_names()
        fields = {k: v for k, v in data.items() if k in names}
        # a holder stored without a worker ran in none: not in the reader's
        fields.setdefault("worker", None)
        return cls(**fields)

    def describe(self) -> str:
        """A one-line description for logs and error messages."""
        if self.engine == "airflow":
            task = f"{self.dag_id}.{self.task_id}[{self.map_index}]"
            who = f"{task} {self.run_id} try {self.try_number}"
        elif self.engine == "temporal":
            who = f"{self.workflow_id}/{self.activity_id} attempt {self.attempt}"
        else:
            who = self.name or "process"
        where = f"{self.worker} ({self.host})" if self.worker else self.host
        return f"{who} on {where} pid {self.pid}"


@functools.cache
def _field_names() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(Holder))


@functools.cache
def _field_order() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Holder))
