"""Daylight saving time: every distinct period gets a distinct key, in every timezone.

Driven by Airflow's own timetable classes. At the autumn fold a local hour (and, for a schedule
that steps by absolute time, a local day) comes twice; its second occurrence keys as the first
one's text plus ``.fold`` (``2024-10-27T02.fold``). Every key that was unambiguous before keeps
its text, so keys already recorded still match. The watcher expects exactly the keys the tasks
take, and the views' audit page tells the two occurrences apart.
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable
from airflow.timetables.trigger import CronTriggerTimetable

from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.lease.keys import Period, business_period, parse_business_date
from airflow_plugins.protection.task_identity import target_from_context
from airflow_plugins.views.pages import audit_page
from airflow_plugins.watcher.dags import TimetableSchedule, watched_dag
from airflow_plugins.watcher.gaps import LeaseRow, RunStatus, expected_runs, judge
from tests.airflow.conftest import task_context

BERLIN = "Europe/Berlin"


def _dag(schedule: Any, start: datetime, tz: str = BERLIN) -> EmptyOperator:
    with DAG("rollup", schedule=schedule, start_date=pendulum.instance(start).in_tz(tz)):
        return EmptyOperator(task_id="aggregate")


def _scheduler_side(task: EmptyOperator) -> Any:
    """The DAG as the scheduler and the watcher see it (serialized: Airflow's core timetables)."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(task.dag))


def _runs(task: EmptyOperator, start: datetime, end: datetime) -> list[datetime]:
    """The logical dates Airflow's timetable schedules with its run_after in [start, end]."""
    schedule = TimetableSchedule(_scheduler_side(task).timetable)
    return [logical for logical, _ in schedule.runs_between(start, end)]


def _keys(task: EmptyOperator, logicals: list[datetime]) -> list[str]:
    return [
        target_from_context(task_context(task, logical_date=at)).business_date for at in logicals
    ]


def test_hourly_cron_in_berlin_keys_the_repeated_hour_apart() -> None:
    task = _dag(
        CronTriggerTimetable("0 * * * *", timezone=BERLIN), datetime(2024, 10, 1, tzinfo=UTC)
    )
    logicals = _runs(
        task, datetime(2024, 10, 26, 22, tzinfo=UTC), datetime(2024, 10, 27, 3, tzinfo=UTC)
    )
    assert len(logicals) == 6
    assert _keys(task, logicals) == [
        "2024-10-27T00",
        "2024-10-27T01",
        "2024-10-27T02",  # 00:00Z, 02:00 CEST: as it always was
        "2024-10-27T02.fold",  # 01:00Z, 02:00 CET: the hour's second occurrence
        "2024-10-27T03",
        "2024-10-27T04",
    ]


def test_hourly_data_interval_cron_keys_the_repeated_hour_apart() -> None:
    task = _dag(
        CronDataIntervalTimetable("0 * * * *", timezone=BERLIN), datetime(2024, 10, 1, tzinfo=UTC)
    )
    logicals = _runs(
        task, datetime(2024, 10, 26, 23, tzinfo=UTC), datetime(2024, 10, 27, 3, tzinfo=UTC)
    )
    keys = _keys(task, logicals)
    assert len(set(keys)) == len(keys) == len(logicals)
    assert {"2024-10-27T02", "2024-10-27T02.fold"} <= set(keys)


@pytest.mark.parametrize(
    "schedule",
    [timedelta(days=1), DeltaDataIntervalTimetable(timedelta(days=1))],
    ids=["timedelta-trigger", "timedelta-data-interval"],
)
def test_a_daily_timedelta_started_at_summer_midnight_keys_every_day_apart(
    schedule: Any,
) -> None:
    summer_midnight = datetime(2024, 10, 20, tzinfo=zoneinfo.ZoneInfo(BERLIN))
    task = _dag(schedule, summer_midnight)
    logicals = [
        at
        for at in _runs(task, summer_midnight, datetime(2024, 11, 2, tzinfo=UTC))
        if datetime(2024, 10, 20, 21, tzinfo=UTC) <= at <= datetime(2024, 10, 29, 23, tzinfo=UTC)
    ]
    keys = _keys(task, logicals)
    assert len(set(keys)) == len(keys) == len(logicals) == 10
    # every run keeps its old key but the second one of the repeated day
    assert keys == [f"2024-10-{d}" for d in range(21, 28)] + [
        "2024-10-27.fold",  # 22:00Z on the 27th: 23:00 CET, the day's second run
        "2024-10-28",
        "2024-10-29",
    ]


@pytest.mark.parametrize(
    "schedule",
    [CronTriggerTimetable("0 * * * *", timezone=BERLIN), timedelta(hours=1), timedelta(days=1)],
    ids=["hourly-cron", "hourly-delta", "daily-delta"],
)
def test_spring_forward_keys_are_distinct_and_unchanged(schedule: Any) -> None:
    task = _dag(schedule, datetime(2025, 3, 1, tzinfo=zoneinfo.ZoneInfo(BERLIN)))
    logicals = _runs(task, datetime(2025, 3, 28, tzinfo=UTC), datetime(2025, 4, 2, tzinfo=UTC))
    keys = _keys(task, logicals)
    assert len(set(keys)) == len(keys) == len(logicals)
    assert not [k for k in keys if ".fold" in k]
    period = Period.HOUR if "T" in keys[0] else Period.DAY
    assert keys == [business_period(at, period, BERLIN) for at in logicals]


def _transitions_2024(zone: zoneinfo.ZoneInfo) -> list[datetime]:
    """The hours of 2024 at which ``zone``'s UTC offset changes (found day by day)."""
    found = []
    day = datetime(2024, 1, 1, tzinfo=UTC)
    while day.year == 2024:
        after = day + timedelta(days=1)
        if day.astimezone(zone).utcoffset() != after.astimezone(zone).utcoffset():
            offset = day.astimezone(zone).utcoffset()
            hour = next(
                day + timedelta(hours=h)
                for h in range(1, 25)
                if (day + timedelta(hours=h)).astimezone(zone).utcoffset() != offset
            )
            found.append(hour)
        day = after
    return found


def test_every_timezone_keys_every_hourly_and_daily_run_apart_across_2024() -> None:
    # each zone's DST transitions of 2024, with Airflow's hourly cron in local time and a
    # daily timedelta
    seen: set[tuple[Any, ...]] = set()
    for name in sorted(zoneinfo.available_timezones()):
        zone = zoneinfo.ZoneInfo(name)
        changes = _transitions_2024(zone)
        # zones with the same transitions and offsets (aliases, most of a continent) key alike
        shape = tuple((c, c.astimezone(zone).utcoffset()) for c in changes)
        if shape in seen:
            continue
        seen.add(shape)
        for change in changes[:4]:
            hourly = _dag(
                CronTriggerTimetable("0 * * * *", timezone=name), change - timedelta(days=3), name
            )
            logicals = _runs(hourly, change - timedelta(hours=3), change + timedelta(hours=3))
            keys = _keys(hourly, logicals)
            assert len(set(keys)) == len(keys), (name, change, keys)
            daily = _dag(timedelta(days=1), change - timedelta(days=2, hours=2), name)
            logicals = _runs(daily, change - timedelta(days=1), change + timedelta(days=2))
            keys = _keys(daily, logicals)
            assert len(set(keys)) == len(keys), (name, change, keys)


def test_the_watcher_expects_both_occurrences_and_reports_the_second_missing() -> None:
    task = _dag(
        CronTriggerTimetable("0 * * * *", timezone=BERLIN), datetime(2024, 10, 1, tzinfo=UTC)
    )
    start, end = datetime(2024, 10, 26, 23, tzinfo=UTC), datetime(2024, 10, 27, 2, tzinfo=UTC)
    watched = watched_dag(_scheduler_side(task), end, first_seen=datetime(2024, 10, 1, tzinfo=UTC))
    runs = list(expected_runs(watched, start, end))
    assert [r.business_date for r in runs] == _keys(task, _runs(task, start, end))
    done = LeaseRow(
        key="rollup/aggregate/2024-10-27T02",
        state="succeeded",
        token=1,
        first_granted_at=datetime(2024, 10, 27, 0, tzinfo=UTC),
        finished_at=datetime(2024, 10, 27, 0, 5, tzinfo=UTC),
    )
    reports = judge(watched, runs, [done], datetime(2024, 10, 28, tzinfo=UTC))
    status = {r.run.business_date: r.status for r in reports}
    assert status["2024-10-27T02"] is RunStatus.DONE
    assert status["2024-10-27T02.fold"] is RunStatus.MISSED


def test_the_fold_form_is_a_valid_conf_date_and_the_audit_page_tells_it_apart(
    lease_db: str,
) -> None:
    assert parse_business_date("2024-10-27T02.fold", Period.HOUR) == "2024-10-27T02.fold"
    assert parse_business_date("2024-10-27.fold", Period.DAY) == "2024-10-27.fold"
    holder = Holder.process("rollup")
    with LeaseStore(lease_db) as store:
        for period in ("2024-10-27T01", "2024-10-27T02", "2024-10-27T02.fold"):
            got = store.acquire(f"rollup/aggregate/{period}", holder)
            store.complete(got.lease, {"period": period})

        def periods(business_date: str) -> list[str]:
            result, _ = audit_page(store, "rollup", business_date, 100)
            return [k.key.split("/")[2] for k in result.keys]

        assert periods("2024-10-27") == ["2024-10-27T01", "2024-10-27T02", "2024-10-27T02.fold"]
        assert periods("2024-10-27T02") == ["2024-10-27T02"]
        assert periods("2024-10-27T02.fold") == ["2024-10-27T02.fold"]
