"""Expected runs versus succeeded leases: which scheduled business runs are done, late or missed.

A protected DAG's timetable says which runs should exist (catchup included: a run the scheduler
skipped because it was down, or because ``catchup=False`` dropped it, is still expected: the
business date was not processed). Each expected run is judged against the lease rows of its
business date:

- ``done``: every protected task of the DAG has a succeeded lease for the business date;
- ``late``: not done, and its deadline (scheduled time + the DAG's deadline) has not passed;
- ``missed``: not done and past its deadline: a compliance gap, reported and paged;
- ``upcoming``: its scheduled time has not come yet.

The protected tasks of a DAG are the ones configured for it plus every task that ever held a
lease for it in the window, so a run where one of two protected tasks never ran is not done.
Imports nothing from Airflow: the timetable is any object with Airflow's ``next_dagrun_info_v2``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from airflow_plugins.lease.keys import SHADOW_SUFFIX, Period, business_period

DEFAULT_DEADLINE = timedelta(minutes=15)


class RunStatus(enum.StrEnum):
    """Where one expected run stands."""

    DONE = "done"
    LATE = "late"
    MISSED = "missed"
    UPCOMING = "upcoming"


class RunSchedule(Protocol):
    """The scheduled runs of a DAG between two instants (an Airflow timetable adapter)."""

    def runs_between(self, start: datetime, end: datetime) -> Iterable[tuple[datetime, datetime]]:
        """Yields ``(logical_date, scheduled_at)`` of each run scheduled in ``[start, end]``."""
        ...


@dataclasses.dataclass(frozen=True)
class WatchedDag:
    """A protected DAG the watcher checks.

    Attributes:
        dag_id: the DAG.
        schedule: its scheduled runs.
        period: the grain of its business date (the same the operator keys leases with).
        timezone: the DAG's timezone, for business dates.
        deadline: how long after its scheduled time a run may finish before it is missed.
        tasks: protected task ids known up front (others are learnt from the leases).
        start: no run before this instant is expected (the DAG's start date, or when it opted in).
        step: a delta schedule's step, so a repeated local period keys as the tasks key it.
    """

    dag_id: str
    schedule: RunSchedule
    period: Period
    timezone: str = "UTC"
    deadline: timedelta = DEFAULT_DEADLINE
    tasks: tuple[str, ...] = ()
    start: datetime | None = None
    step: Any = None


@dataclasses.dataclass(frozen=True)
class ExpectedRun:
    """One run the timetable expects."""

    dag_id: str
    business_date: str
    logical_date: datetime
    scheduled_at: datetime
    deadline: datetime


@dataclasses.dataclass(frozen=True)
class LeaseRow:
    """The part of a lease row the watcher reads (``task_id`` and ``business_date`` are the
    key's parts, as the operator wrote them: ``dag/task/period[/map]``)."""

    key: str
    state: str
    token: int
    first_granted_at: datetime | None
    finished_at: datetime | None
    takeovers: int = 0
    task_id: str = ""
    business_date: str = ""

    def __post_init__(self) -> None:
        if not self.task_id:
            parts = self.key.removesuffix(SHADOW_SUFFIX).split("/")
            object.__setattr__(self, "task_id", parts[1] if len(parts) > 1 else "")
            object.__setattr__(self, "business_date", parts[2] if len(parts) > 2 else "")

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LeaseRow:
        """Reads a row of the ``dag_leases`` query."""
        return cls(
            key=row["key"],
            state=row["state"],
            token=row["token"],
            first_granted_at=row["first_granted_at"],
            finished_at=row["finished_at"],
            takeovers=row["takeovers"],
        )


@dataclasses.dataclass(frozen=True)
class RunReport:
    """The verdict on one expected run.

    Attributes:
        first_granted_at: when the first protected task first got its lease.
        finished_at: when the last protected task succeeded (done runs only).
        missing_tasks: protected tasks with no succeeded lease for the business date.
    """

    run: ExpectedRun
    status: RunStatus
    first_granted_at: datetime | None
    finished_at: datetime | None
    missing_tasks: tuple[str, ...]
    takeovers: int

    @property
    def start_lag(self) -> timedelta | None:
        """Scheduled time -> first lease granted."""
        if self.first_granted_at is None:
            return None
        return self.first_granted_at - self.run.scheduled_at

    @property
    def finish_lag(self) -> timedelta | None:
        """Scheduled time -> last protected task succeeded."""
        if self.finished_at is None:
            return None
        return self.finished_at - self.run.scheduled_at

    @property
    def is_gap(self) -> bool:
        """Late or missed."""
        return self.status in (RunStatus.LATE, RunStatus.MISSED)


def expected_runs(dag: WatchedDag, start: datetime, end: datetime) -> Iterator[ExpectedRun]:
    """The runs ``dag``'s timetable schedules in ``[start, end]`` (by scheduled time)."""
    if dag.start is not None:
        start = max(start, dag.start)
    seen: set[str] = set()
    for logical_date, scheduled_at in dag.schedule.runs_between(start, end):
        if scheduled_at < start or scheduled_at > end:
            continue
        business_date = business_period(logical_date, dag.period, dag.timezone, step=dag.step)
        if business_date in seen:
            continue
        seen.add(business_date)
        yield ExpectedRun(
            dag_id=dag.dag_id,
            business_date=business_date,
            logical_date=logical_date,
            scheduled_at=scheduled_at,
            deadline=scheduled_at + dag.deadline,
        )


def judge(
    dag: WatchedDag, runs: Sequence[ExpectedRun], leases: Iterable[LeaseRow], now: datetime
) -> list[RunReport]:
    """Judges each expected run against the DAG's lease rows (see the module docstring)."""
    by_date: dict[str, list[LeaseRow]] = {}
    protected = set(dag.tasks)
    for lease in leases:
        if lease.key.endswith(SHADOW_SUFFIX):
            continue
        by_date.setdefault(lease.business_date, []).append(lease)
        protected.add(lease.task_id)
    return [_judge_run(run, by_date.get(run.business_date, []), protected, now) for run in runs]


def _judge_run(
    run: ExpectedRun, leases: list[LeaseRow], protected: set[str], now: datetime
) -> RunReport:
    succeeded: set[str] = set()
    unfinished: set[str] = set()
    for lease in leases:
        (succeeded if lease.state == "succeeded" else unfinished).add(lease.task_id)
    # a mapped task is done only when none of its map keys is unfinished
    done_tasks = succeeded - unfinished
    missing = tuple(sorted(protected - done_tasks)) if protected else ("(any)",)
    grants = [lease.first_granted_at for lease in leases if lease.first_granted_at is not None]
    first_granted = min(grants) if grants else None
    finished_at = None
    if not missing and leases:
        status = RunStatus.DONE
        finished_at = max(
            (lease.finished_at for lease in leases if lease.finished_at is not None),
            default=None,
        )
    elif now < run.scheduled_at:
        status = RunStatus.UPCOMING
    elif now < run.deadline:
        status = RunStatus.LATE
    else:
        status = RunStatus.MISSED
    return RunReport(
        run=run,
        status=status,
        first_granted_at=first_granted,
        finished_at=finished_at,
        missing_tasks=() if status is RunStatus.DONE else missing,
        takeovers=sum(lease.takeovers for lease in leases),
    )
