"""``temporal-scheduled`` mode: a Temporal Schedule with the DAG's cron and an overlap policy.

The schedule starts ``ScheduledDagWorkflow``, which derives the business date from the nominal
time and starts the DAG-run workflow as a child with the key-derived id.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)
from temporalio.service import RPCError, RPCStatusCode

from bridge.spec import SCHEDULABLE_TIMETABLES, DagSpec, ScheduledRunInput, needs_airflow_run
from bridge.worker.workflows import ScheduledDagWorkflow

OVERLAP = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer_one": ScheduleOverlapPolicy.BUFFER_ONE,
    "buffer_all": ScheduleOverlapPolicy.BUFFER_ALL,
    "allow_all": ScheduleOverlapPolicy.ALLOW_ALL,
}


class NoCronSchedule(ValueError):
    """The DAG has no cron expression to schedule in Temporal."""


def schedule_id(dag_id: str) -> str:
    """The id of a DAG's Temporal Schedule."""
    return f"bridge-schedule:{dag_id}"


def schedule_spec(spec: DagSpec) -> ScheduleSpec:
    """When the DAG's Temporal Schedule fires: its cron expression in its timezone.

    Raises:
        NoCronSchedule: the DAG has no cron expression, or its timetable is one a Temporal
            Schedule cannot reproduce (named in the error: delta, events, multiple crons, ...).
    """
    if spec.timetable is not None and spec.timetable not in SCHEDULABLE_TIMETABLES:
        raise NoCronSchedule(
            f"{spec.dag_id}: temporal-scheduled cannot reproduce its timetable {spec.timetable} "
            f"(only {', '.join(sorted(SCHEDULABLE_TIMETABLES))}): its runs would not match "
            "Airflow's run for run; keep it scheduled by Airflow (mode temporal hands each run "
            "over)"
        )
    if not spec.schedule:
        raise NoCronSchedule(f"{spec.dag_id} has no cron schedule to move to Temporal")
    reads = needs_airflow_run(spec)
    if reads:
        raise NoCronSchedule(
            f"{spec.dag_id}: its tasks decide from the Airflow run handed over "
            f"({'; '.join(reads)}), which a run Temporal's Schedule starts does not have; keep "
            "it scheduled by Airflow (mode temporal hands each run over)"
        )
    if _observes_dst(spec.timezone):
        raise NoCronSchedule(
            f"{spec.dag_id}: temporal-scheduled cannot reproduce its runs in {spec.timezone}, "
            "which changes its UTC offset: at a DST fold Temporal's Schedule fires a repeated "
            "wall-clock hour once where Airflow runs it twice (a missed run); keep it "
            "scheduled by Airflow (mode temporal hands each run over)"
        )
    return ScheduleSpec(cron_expressions=[spec.schedule], time_zone_name=spec.timezone)


def _observes_dst(timezone: str) -> bool:
    """Whether ``timezone`` changes its UTC offset within a year from now."""
    zone = ZoneInfo(timezone)
    now = datetime.now(UTC)
    offsets = {(now + timedelta(days=d)).astimezone(zone).utcoffset() for d in range(0, 366, 7)}
    return len(offsets) > 1


async def create_schedule(
    client: Client,
    spec: DagSpec,
    task_queue: str,
    *,
    overlap: str = "buffer_one",
    rpc_timeout_s: float | None = None,
) -> str:
    """Creates the DAG's schedule; returns its id. One already there (left by a rollback whose
    delete failed) is replaced, so the ticks run this spec, queue and overlap, not an old one.

    Overlap ``buffer_one`` (default): a tick that comes while the previous run still runs waits
    for it, one deep; no tick is silently dropped, none runs concurrently with another.

    Raises:
        NoCronSchedule: the DAG has no cron expression.
        KeyError: unknown overlap policy.
    """
    when = schedule_spec(spec)
    sid = schedule_id(spec.dag_id)
    timeout = timedelta(seconds=rpc_timeout_s) if rpc_timeout_s else None
    made = Schedule(
        action=ScheduleActionStartWorkflow(
            ScheduledDagWorkflow.run,
            ScheduledRunInput(spec, task_queue),
            id=f"bridge-tick:{spec.dag_id}",
            task_queue=task_queue,
        ),
        spec=when,
        policy=SchedulePolicy(overlap=OVERLAP[overlap]),
    )
    try:
        await client.create_schedule(sid, made, rpc_timeout=timeout)
    except ScheduleAlreadyRunningError:
        await delete_schedule(client, spec.dag_id, rpc_timeout_s=rpc_timeout_s)
        await client.create_schedule(sid, made, rpc_timeout=timeout)
    return sid


async def delete_schedule(
    client: Client, dag_id: str, *, rpc_timeout_s: float | None = None
) -> bool:
    """Deletes the DAG's schedule (running runs go on); returns whether one existed."""
    timeout = timedelta(seconds=rpc_timeout_s) if rpc_timeout_s else None
    try:
        await client.get_schedule_handle(schedule_id(dag_id)).delete(rpc_timeout=timeout)
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True
