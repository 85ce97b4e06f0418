"""Airflow's per-task view of a handed-over run, read from its Temporal workflow's history.

A run handed to Temporal shows in Airflow as one deferred task; what each of its tasks did is
in the workflow's history: one ``bridge.run_task`` activity per call (a held lease's wait calls
again), its attempts, start and end, and failure. ``read_run_view`` folds that history into one
row per task (and item of a mapped task), read with a bounded number of events and a deadline.
Failure messages are masked (``airflow_plugins.lease.masking``) and cut short: a page shows
neither secrets nor payloads, only each task's state.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from airflow_plugins.lease.masking import mask_text

RUN_TASK = "bridge.run_task"
MAX_EVENTS = 20_000
MAX_FAILURE_CHARS = 500


@dataclasses.dataclass
class TaskView:
    """One task (or one item of a mapped task) of the run, as its activities went.

    Attributes:
        task_id: the task.
        map_key: the item of a mapped task, or None.
        state: ``scheduled``, ``running``, ``succeeded``, ``recorded`` (done before, its
            recorded result), ``failed``, ``timed out`` or ``cancelled``.
        attempts: attempts over every call of the task (a held lease's wait calls again).
        started: when its first attempt started (ISO, UTC), if one did.
        ended: when its last call ended, if it did.
        duration_ms: from the first start to the last end.
        failure: the last failure's message (masked, cut short), if any.
    """

    task_id: str
    map_key: str | None
    state: str = "scheduled"
    attempts: int = 0
    started: str | None = None
    ended: str | None = None
    duration_ms: int | None = None
    failure: str | None = None


@dataclasses.dataclass(frozen=True)
class RunView:
    """A workflow execution and its tasks, in the order they were first scheduled."""

    workflow_id: str
    run_id: str | None
    status: str
    started: str | None
    ended: str | None
    tasks: tuple[TaskView, ...]
    truncated: bool = False


def _when(moment: Any) -> datetime | None:
    return moment.ToDatetime() if moment is not None and moment.seconds else None


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _failure(message: str) -> str:
    text = mask_text(message)
    return text if len(text) <= MAX_FAILURE_CHARS else text[:MAX_FAILURE_CHARS] + "..."


class _Fold:
    """Folds history events into task rows."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.tasks: dict[tuple[str, str | None], TaskView] = {}
        self.by_scheduled: dict[int, TaskView] = {}
        self.by_activity: dict[str, TaskView] = {}
        self.first_start: dict[int, datetime] = {}
        self.times: dict[int, tuple[datetime | None, datetime | None]] = {}

    async def scheduled(self, event: Any) -> None:
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name != RUN_TASK:
            return
        values = await self.client.data_converter.decode(list(attrs.input.payloads))
        inp = values[0] if values and isinstance(values[0], dict) else {}
        task_id = str((inp.get("task") or {}).get("task_id") or f"activity {attrs.activity_id}")
        map_key = inp.get("map_key")
        row = self.tasks.setdefault((task_id, map_key), TaskView(task_id, map_key))
        if row.state not in ("succeeded", "recorded"):
            row.state = "scheduled"
        self.by_scheduled[event.event_id] = row
        self.by_activity[attrs.activity_id] = row

    def started(self, event: Any) -> None:
        attrs = event.activity_task_started_event_attributes
        row = self.by_scheduled.get(attrs.scheduled_event_id)
        if row is None:
            return
        row.state = "running"
        row.attempts += max(1, attrs.attempt)
        moment = _when(event.event_time)
        first, last = self.times.get(id(row), (None, None))
        self.times[id(row)] = (first or moment, last)

    async def ended(self, event: Any, attrs: Any, state: str) -> None:
        row = self.by_scheduled.get(attrs.scheduled_event_id)
        if row is None:
            return
        if state == "completed":
            values = await self.client.data_converter.decode(list(attrs.result.payloads))
            result = values[0] if values and isinstance(values[0], dict) else {}
            status = str(result.get("status") or "succeeded")
            # a held lease is a wait, not an end: the workflow calls again
            row.state = "scheduled" if status in ("held", "unavailable") else status
        else:
            row.state = state
            failure = getattr(attrs, "failure", None)
            if failure is not None and failure.message:
                row.failure = _failure(failure.message)
        first, _ = self.times.get(id(row), (None, None))
        self.times[id(row)] = (first, _when(event.event_time))

    def finish(self) -> tuple[TaskView, ...]:
        for row in self.tasks.values():
            first, last = self.times.get(id(row), (None, None))
            row.started, row.ended = _iso(first), _iso(last)
            if first is not None and last is not None:
                row.duration_ms = int((last - first).total_seconds() * 1000)
        return tuple(self.tasks.values())


async def _read(client: Client, workflow_id: str, max_events: int) -> RunView:
    handle = client.get_workflow_handle(workflow_id)
    described = await handle.describe()
    fold = _Fold(client)
    count = 0
    truncated = False
    async for event in handle.fetch_history_events():
        count += 1
        if count > max_events:
            truncated = True
            break
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            await fold.scheduled(event)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            fold.started(event)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            await fold.ended(event, event.activity_task_completed_event_attributes, "completed")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            await fold.ended(event, event.activity_task_failed_event_attributes, "failed")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            await fold.ended(event, event.activity_task_timed_out_event_attributes, "timed out")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            await fold.ended(event, event.activity_task_canceled_event_attributes, "cancelled")
    # a running activity's started event is only written when it ends: its attempt is pending
    for pending in described.raw_description.pending_activities:
        row = fold.by_activity.get(pending.activity_id)
        if row is not None and row.state == "scheduled" and pending.attempt:
            row.state = "running"
            row.attempts += pending.attempt
            if pending.last_failure.message:
                row.failure = _failure(pending.last_failure.message)
            started = _when(pending.last_started_time)
            first, last = fold.times.get(id(row), (None, None))
            fold.times[id(row)] = (first or started, last)
    return RunView(
        workflow_id=workflow_id,
        run_id=described.run_id,
        status=described.status.name.lower() if described.status else "unknown",
        started=_iso(described.start_time),
        ended=_iso(described.close_time),
        tasks=fold.finish(),
        truncated=truncated,
    )


async def read_run_view(
    client: Client, workflow_id: str, *, timeout_s: float = 15.0, max_events: int = MAX_EVENTS
) -> RunView:
    """The per-task view of ``workflow_id``'s latest execution.

    Raises:
        TimeoutError: Temporal did not give the history within ``timeout_s``.
        temporalio.service.RPCError: no such workflow, or Temporal refused.
    """
    return await asyncio.wait_for(_read(client, workflow_id, max_events), timeout=timeout_s)
