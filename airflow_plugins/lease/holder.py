"""Who holds a lease: a structured identity, recorded on the lease and in every audit row."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
from typing import Any, Literal

Engine = Literal["airflow", "temporal", "process"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Holder:
    """The identity of one execution that holds (or asks for) a lease.

    Airflow fills dag/run/task/map index/try; Temporal fills workflow/run/activity/attempt;
    any other Python service uses ``Holder.process``. Host and pid say where it runs.
    """

    engine: Engine
    host: str = dataclasses.field(default_factory=socket.gethostname)
    pid: int = dataclasses.field(default_factory=os.getpid)
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
        return cls(**{k: v for k, v in data.items() if k in names})

    def describe(self) -> str:
        """A one-line description for logs and error messages."""
        if self.engine == "airflow":
            task = f"{self.dag_id}.{self.task_id}[{self.map_index}]"
            who = f"{task} {self.run_id} try {self.try_number}"
        elif self.engine == "temporal":
            who = f"{self.workflow_id}/{self.activity_id} attempt {self.attempt}"
        else:
            who = self.name or "process"
        return f"{who} on {self.host} pid {self.pid}"


@functools.cache
def _field_names() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(Holder))


@functools.cache
def _field_order() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Holder))
