"""Gap detection against real lease-store rows on the real Postgres.

The scheduled runs come from Airflow's own timetable classes; the leases are taken and finished
through the lease store exactly as protected tasks do. "Now" is the watcher's clock, so a
run's deadline can be put in the past or the future without sleeping.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from airflow.timetables.trigger import CronTriggerTimetable

from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.lease.keys import Period, business_period, lease_key
from airflow_plugins.watcher import RunReport, RunStatus, WatchedDag, Watcher, evaluate
from airflow_plugins.watcher.dags import TimetableSchedule, watched_dag
from airflow_plugins.watcher.service import serve_health

DAG = "compliance_minutely"


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


@pytest.fixture
def now() -> datetime:
    return _minute(datetime.now(UTC)) + timedelta(seconds=30)


@pytest.fixture
def minutely(now: datetime) -> WatchedDag:
    return WatchedDag(
        dag_id=DAG,
        schedule=TimetableSchedule(CronTriggerTimetable("* * * * *", timezone="UTC")),
        period=Period.MINUTE,
        deadline=timedelta(minutes=2),
        tasks=("backup", "verify"),
        start=_minute(now) - timedelta(minutes=12),
    )


def run_protected(store: LeaseStore, at: datetime, tasks: tuple[str, ...], finish: bool) -> None:
    """Takes (and completes, if ``finish``) the leases of one business run, as a task would."""
    period = business_period(at, Period.MINUTE)
    for task in tasks:
        key = str(lease_key(DAG, task, period))
        holder = Holder.airflow(
            dag_id=DAG, run_id=f"scheduled__{period}", task_id=task, try_number=1
        )
        got = store.acquire(key, holder, business_date=at.date(), input={"period": period})
        assert got.granted
        if finish:
            store.complete(got.lease, {"ok": True})


def by_status(reports: list[RunReport]) -> dict[RunStatus, list[str]]:
    found: dict[RunStatus, list[str]] = {status: [] for status in RunStatus}
    for report in reports:
        found[report.status].append(report.run.business_date)
    return found


def test_a_stopped_scheduler_leaves_exactly_its_missing_runs_missed(
    store: LeaseStore, minutely: WatchedDag, now: datetime
) -> None:
    base = _minute(now)
    stopped = [base - timedelta(minutes=m) for m in (8, 7, 6)]  # scheduler down 3 intervals
    for m in range(12, 0, -1):
        at = base - timedelta(minutes=m)
        if at in stopped:
            continue
        # the run one minute ago is still running: late, within its 2 min deadline
        run_protected(store, at, ("backup", "verify"), finish=m != 1)
    # the run at base: one task done, the other not yet started -> late, not missed
    run_protected(store, base, ("backup",), finish=True)

    with store.connection() as conn:
        reports = evaluate(conn, minutely, base - timedelta(minutes=12), now, now)

    found = by_status(reports)
    assert found[RunStatus.MISSED] == [business_period(at, Period.MINUTE) for at in stopped]
    assert sorted(found[RunStatus.LATE]) == [
        business_period(base - timedelta(minutes=1), Period.MINUTE),
        business_period(base, Period.MINUTE),
    ]
    assert len(found[RunStatus.DONE]) == 12 - 3 - 1
    late_now = next(r for r in reports if r.run.scheduled_at == base)
    assert late_now.missing_tasks == ("verify",)
    # every done run has its lags measured from its scheduled time
    for report in reports:
        if report.status is RunStatus.DONE:
            assert report.start_lag is not None
            assert report.finish_lag is not None


def test_no_gap_reports_nothing_and_late_is_not_missed(
    store: LeaseStore, minutely: WatchedDag, now: datetime
) -> None:
    base = _minute(now)
    for m in range(12, 0, -1):
        run_protected(store, base - timedelta(minutes=m), ("backup", "verify"), finish=True)
    reports_seen: list[RunReport] = []
    watcher = Watcher(
        store,
        lambda _: [minutely],
        lookback=timedelta(minutes=12),
        on_missed=reports_seen.append,
        emit_metrics=False,
        clock=lambda: now,
    )
    result = watcher.look()
    assert result.newly_missed == []
    assert reports_seen == []
    assert result.count(RunStatus.MISSED) == 0
    # only the run scheduled at `base` (30 s ago) is not done: late, within its deadline
    assert [r.run.scheduled_at for r in result.reports if r.is_gap] == [base]
    assert result.count(RunStatus.LATE) == 1


def test_missed_runs_are_reported_once_even_across_a_watcher_restart(
    store: LeaseStore, minutely: WatchedDag, now: datetime
) -> None:
    base = _minute(now)
    for m in (12, 11, 10, 6, 5, 4, 3, 2, 1):
        run_protected(store, base - timedelta(minutes=m), ("backup", "verify"), finish=True)
    paged: list[RunReport] = []

    def make() -> Watcher:
        return Watcher(
            store,
            lambda _: [minutely],
            lookback=timedelta(minutes=12),
            on_missed=paged.append,
            emit_metrics=False,
            clock=lambda: now,
        )

    first = make()
    result = first.look()
    expected = [business_period(base - timedelta(minutes=m), Period.MINUTE) for m in (9, 8, 7)]
    assert [r.run.business_date for r in result.newly_missed] == expected
    assert [r.run.business_date for r in paged] == expected
    assert first.look().newly_missed == []  # the same watcher does not page again
    assert make().look().newly_missed == []  # nor does a restarted one (audit rows)
    assert len(paged) == 3
    # the audit trail holds one missed_run row per missed run, for the audit page
    for period in expected:
        rows = store.history(str(lease_key(DAG, "_dag_run", period)))
        assert [(r["event"], r["outcome"], r["actor"]) for r in rows] == [
            ("missed_run", "missed", "watcher")
        ]


def test_the_health_endpoint_answers_503_until_a_look_succeeds(
    store: LeaseStore, minutely: WatchedDag, now: datetime
) -> None:
    watcher = Watcher(store, lambda _: [minutely], emit_metrics=False)
    server = serve_health(watcher, poll=5.0, port=29_410, host="127.0.0.1")
    try:
        url = "http://127.0.0.1:29410/health"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 503
        refused.value.close()
        watcher.look()
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.loads(answer.read())
        assert answer.status == 200
        assert body["status"] == "ok"
    finally:
        server.shutdown()
        server.server_close()


def test_a_dag_objects_timetable_gives_its_runs_catchup_included() -> None:
    from airflow.sdk import DAG as SdkDag

    start = datetime(2024, 2, 15, tzinfo=UTC)
    from airflow.serialization.serialized_objects import DagSerialization

    with SdkDag("hourly_rollup", schedule="@hourly", start_date=start, catchup=False) as dag:
        pass
    # what the dag-processor stores and the watcher reads back
    stored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    watched = watched_dag(stored, start + timedelta(days=1))
    assert watched.period is Period.HOUR
    runs = list(watched.schedule.runs_between(start, start + timedelta(hours=5)))
    # catchup=False does not shrink what is expected: each hour is a business run
    assert len(runs) >= 5
    periods = [business_period(logical, Period.HOUR) for logical, _ in runs]
    assert periods[:5] == [f"2024-02-15T0{h}" for h in range(5)]


@pytest.mark.parametrize(
    "expression",
    [
        "* * * * *",
        "0 * * * *",
        "0 2 * * *",
        "*/15 9-17 * * 1-5",
        "30 6 1,15 * *",
        "0 0 1 */3 *",
        "@daily",
        "0 12 13 * 5",
    ],
)
def test_the_fast_cron_path_gives_airflows_own_fire_times(expression: str) -> None:
    from airflow_plugins.watcher.cron import fast_cron

    timetable = CronTriggerTimetable(expression, timezone="UTC")
    assert fast_cron(timetable) is not None
    start = datetime(2024, 2, 15, 0, 0, 30, tzinfo=UTC)
    span = timedelta(days=2) if expression == "* * * * *" else timedelta(days=366)
    fast = list(TimetableSchedule(timetable).runs_between(start, start + span))

    class Slow:  # the same timetable, through Airflow's own stepping
        def __init__(self, inner: CronTriggerTimetable) -> None:
            self.inner = inner

        def next_dagrun_info_v2(self, **kwargs: object) -> object:
            return self.inner.next_dagrun_info_v2(**kwargs)  # type: ignore[arg-type]

    slow = list(TimetableSchedule(Slow(timetable)).runs_between(start, start + span))
    assert fast == slow
    assert len(fast) >= 4
