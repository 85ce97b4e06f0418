"""One key for one run, whichever engine schedules it (``temporal-scheduled`` at cutover).

A property test over Airflow's timetable classes x timezones x DST dates: Temporal's fire times
come from the real dev server (a paused Schedule's upcoming actions, created from the bridge's
own ``schedule_spec``), Airflow's runs from its own timetable, and each run must get the same key
from the bridge (``tick_business_date``) as the Airflow operator gives it. A timetable Temporal
cannot reproduce is refused by name. Heavy: runs the Temporal dev server (take the lock).
"""

from __future__ import annotations

import asyncio
import uuid
import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import (
    DAG,
    CronDataIntervalTimetable,
    CronTriggerTimetable,
    DeltaDataIntervalTimetable,
    DeltaTriggerTimetable,
    EventsTimetable,
    MultipleCronTriggerTimetable,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.client import Client, Schedule, ScheduleActionStartWorkflow, ScheduleState

from airflow_plugins.protection.task_identity import target_from_context
from airflow_plugins.watcher.dags import TimetableSchedule
from bridge.identity import tick_business_date
from bridge.in_airflow.translate import translate
from bridge.temporal.schedule import NoCronSchedule, create_schedule, schedule_spec
from tests.airflow.conftest import task_context

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata", "UTC"]
# the timetables Temporal can run, as Airflow builds them; (name, factory, how far apart)
CRONS = [
    ("cron-trigger hourly", lambda tz: CronTriggerTimetable("0 * * * *", timezone=tz), "h"),
    ("cron-interval hourly", lambda tz: CronDataIntervalTimetable("0 * * * *", timezone=tz), "h"),
    ("cron-trigger daily", lambda tz: CronTriggerTimetable("30 1 * * *", timezone=tz), "d"),
    ("cron-interval daily", lambda tz: CronDataIntervalTimetable("0 0 * * *", timezone=tz), "d"),
]


def _transitions(zone: zoneinfo.ZoneInfo, year: int) -> list[datetime]:
    found = []
    day = datetime(year, 1, 1, tzinfo=UTC)
    while day.year == year:
        offset = day.astimezone(zone).utcoffset()
        if offset != (day + timedelta(days=1)).astimezone(zone).utcoffset():
            found += [
                day + timedelta(hours=h)
                for h in range(1, 25)
                if (day + timedelta(hours=h)).astimezone(zone).utcoffset() != offset
            ][:1]
        day += timedelta(days=1)
    return found or [datetime(year, 3, 30, 12, tzinfo=UTC), datetime(year, 10, 30, tzinfo=UTC)]


def _task(timetable: Any, tz: str) -> EmptyOperator:
    with DAG(
        "rollup",
        schedule=timetable,
        start_date=pendulum.datetime(2026, 1, 1, tz=tz),
        catchup=True,
    ) as dag:
        task = EmptyOperator(task_id="aggregate")
    assert dag is task.dag
    return task


def _airflow_runs(
    task: EmptyOperator, start: datetime, end: datetime
) -> list[tuple[datetime, str]]:
    """(run_after, the operator's business date) of each run Airflow's timetable schedules."""
    from airflow.serialization.serialized_objects import DagSerialization

    core = DagSerialization.from_dict(DagSerialization.to_dict(task.dag)).timetable
    out = []
    for logical, run_after in TimetableSchedule(core).runs_between(start, end):
        key = target_from_context(task_context(task, logical_date=logical)).business_date
        out.append((run_after.astimezone(UTC), key))
    return out


async def _temporal_fires(
    address: str, spec: Any, start: datetime, end: datetime
) -> list[datetime]:
    """The fire times the real Temporal server plans for the DAG's schedule in [start, end]."""
    client = await Client.connect(address)
    when = schedule_spec(spec)
    when.start_at, when.end_at = start, end
    handle = await client.create_schedule(
        f"keys-{uuid.uuid4()}",
        Schedule(
            action=ScheduleActionStartWorkflow(
                "never.Runs", id=f"w-{uuid.uuid4()}", task_queue="none"
            ),
            spec=when,
            state=ScheduleState(paused=True),
        ),
    )
    try:
        described = await handle.describe()
        return [t.astimezone(UTC) for t in described.info.next_action_times]
    finally:
        await handle.delete()


@settings(
    max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    which=st.sampled_from(range(len(CRONS))),
    tz=st.sampled_from(ZONES),
    transition=st.sampled_from([0, 1]),
)
def test_each_run_has_one_key_in_both_engines(
    temporal_address: str, which: int, tz: str, transition: int
) -> None:
    name, timetable, grain = CRONS[which]
    at = _transitions(zoneinfo.ZoneInfo(tz), 2027)[transition]
    span = timedelta(hours=4) if grain == "h" else timedelta(days=4)
    start, end = at - span, at + span
    task = _task(timetable(tz), tz)
    spec = translate(task.dag).spec
    assert spec is not None
    if tz not in ("UTC", "Asia/Kolkata"):
        # Temporal fires a fold's repeated hour once where Airflow runs it twice (found by
        # this test on the real server): refused by name, never a silently missed run
        with pytest.raises(NoCronSchedule, match=f"cannot reproduce its runs in {tz}"):
            schedule_spec(spec)
        return
    # both engines' runs due in [start, end): Airflow's asked over a wider window, as its
    # window bounds a data interval's start, not the run's due time
    fires = [
        at for at in asyncio.run(_temporal_fires(temporal_address, spec, start, end)) if at < end
    ]
    airflow = [
        (run_after, key)
        for run_after, key in _airflow_runs(task, start - span, end + span)
        if start <= run_after < end
    ]
    assert fires
    assert fires == [run_after for run_after, _ in airflow], (name, tz, at)
    assert [tick_business_date(spec, fire) for fire in fires] == [k for _, k in airflow], (
        name,
        tz,
        at,
    )


@pytest.mark.parametrize(
    "timetable",
    [
        DeltaTriggerTimetable(timedelta(days=1)),
        DeltaDataIntervalTimetable(timedelta(hours=6)),
        EventsTimetable([pendulum.datetime(2027, 1, 5, tz="UTC")]),
        MultipleCronTriggerTimetable("0 2 * * *", "0 14 * * *", timezone="UTC"),
    ],
    ids=lambda t: type(t).__name__,
)
def test_a_timetable_temporal_cannot_reproduce_is_refused_by_name(timetable: Any) -> None:
    spec = translate(_task(timetable, "UTC").dag).spec
    assert spec is not None
    with pytest.raises(NoCronSchedule, match=type(timetable).__name__):
        asyncio.run(create_schedule(None, spec, "q"))  # type: ignore[arg-type]
