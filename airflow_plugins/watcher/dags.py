"""The protected DAGs the watcher checks, read from Airflow's metadata database.

The watcher is not task code: it may read the metadata database (serialized DAGs and their
tags), which is how it learns each protected DAG's timetable without a running scheduler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from airflow_plugins.watcher import settings
from airflow_plugins.watcher.cron import fast_cron
from airflow_plugins.watcher.gaps import WatchedDag

# Airflow's timetables hand back at most this many runs per question, so a year of a
# per-minute DAG cannot make one call run away with memory.
MAX_RUNS_PER_QUERY = 600_000


@dataclasses.dataclass(frozen=True)
class TimetableSchedule:
    """The scheduled runs of an Airflow timetable (any ``Timetable`` subclass)."""

    timetable: Any

    def runs_between(self, start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
        """Yields ``(logical_date, scheduled_at)`` for each run scheduled in ``[start, end]``.

        ``scheduled_at`` is Airflow's ``run_after``: the moment the scheduler should create the
        run (the end of the data interval for interval timetables).
        """
        fast = fast_cron(self.timetable)
        if fast is not None:
            for fire in fast.fires(start, end):
                yield fire, fire
            return
        from airflow.sdk.timezone import coerce_datetime
        from airflow.timetables.base import TimeRestriction

        restriction = TimeRestriction(
            earliest=coerce_datetime(start), latest=coerce_datetime(end), catchup=True
        )
        info = None
        for _ in range(MAX_RUNS_PER_QUERY):
            info = self.timetable.next_dagrun_info_v2(
                last_dagrun_info=info, restriction=restriction
            )
            if info is None or info.run_after > end:
                return
            logical = info.logical_date if info.logical_date is not None else info.run_after
            yield logical, info.run_after


def schedule_interval(schedule: TimetableSchedule, around: datetime) -> timedelta | None:
    """The time between two consecutive scheduled runs after ``around`` (None if fewer)."""
    runs = []
    for _, scheduled_at in schedule.runs_between(around, around + timedelta(days=800)):
        runs.append(scheduled_at)
        if len(runs) == 2:
            return runs[1] - runs[0]
    return None


def protected_dags(now: datetime) -> list[WatchedDag]:
    """The unpaused, non-stale protected DAGs, with their timetables.

    A DAG is protected as the listener judges it
    (``airflow_plugins.protection.listener.dag_is_protected``): it carries the opt-in tag, or it has
    an exactly-once task (``ExactlyOnceOperator``, ``@exactly_once_task``) without the tag. A paused
    DAG is not watched (pausing is a deliberate act, visible in Airflow). Runs are expected from the
    later of the DAG's start date and the moment this Airflow first saw the DAG (its first DAG
    version), so deploying a DAG with an old start date does not report years of runs it was never
    asked to make.

    Each DAG's latest serialization is deserialized once per version (``dag_hash``) and kept,
    so a look reads only hashes for DAGs that did not change.
    """
    from airflow.models.dag import DagModel
    from airflow.models.dag_version import DagVersion
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    from airflow_plugins.protection.listener import dag_is_protected

    watched = []
    with create_session() as session:
        rows = session.execute(
            select(DagModel.dag_id, func.min(DagVersion.created_at))
            .join(DagVersion, DagVersion.dag_id == DagModel.dag_id)
            .where(DagModel.is_stale.is_(False), DagModel.is_paused.is_(False))
            .group_by(DagModel.dag_id)
        ).all()
        latest = _latest_hashes(session, [dag_id for dag_id, _ in rows])
        for gone in set(_dags) - {dag_id for dag_id, _ in rows}:
            del _dags[gone]  # paused, stale or deleted since: not kept for ever
        for dag_id, first_seen in sorted(rows):
            dag = _dag_of_version(session, dag_id, latest.get(dag_id))
            if dag is None or dag.timetable is None or not dag.timetable.can_be_scheduled:
                continue
            if dag_is_protected(dag):  # the opt-in tag, or an exactly-once task
                watched.append(watched_dag(dag, now, first_seen=first_seen))
    return watched


# dag_id -> (dag_hash, the deserialized DAG of that version)
_dags: dict[str, tuple[str, Any]] = {}


def _latest_hashes(session: Any, dag_ids: list[str]) -> dict[str, str]:
    """The ``dag_hash`` of each DAG's latest serialized version (no DAG data read)."""
    from airflow.models.dag_version import DagVersion
    from airflow.models.serialized_dag import SerializedDagModel
    from sqlalchemy import func, select

    if not dag_ids:
        return {}
    newest = (
        select(DagVersion.dag_id, func.max(DagVersion.version_number).label("number"))
        .join(SerializedDagModel, SerializedDagModel.dag_version_id == DagVersion.id)
        .where(DagVersion.dag_id.in_(dag_ids))
        .group_by(DagVersion.dag_id)
        .subquery()
    )
    rows = session.execute(
        select(SerializedDagModel.dag_id, SerializedDagModel.dag_hash)
        .join(DagVersion, SerializedDagModel.dag_version_id == DagVersion.id)
        .join(
            newest,
            (DagVersion.dag_id == newest.c.dag_id) & (DagVersion.version_number == newest.c.number),
        )
    ).all()
    return {str(dag_id): str(dag_hash) for dag_id, dag_hash in rows}


def _dag_of_version(session: Any, dag_id: str, dag_hash: str | None) -> Any:
    """The DAG of its latest serialized version, deserialized only when that version is new."""
    from airflow.models.serialized_dag import SerializedDagModel

    if dag_hash is None:
        _dags.pop(dag_id, None)
        return None
    kept = _dags.get(dag_id)
    if kept is not None and kept[0] == dag_hash:
        return kept[1]
    row = SerializedDagModel.get(dag_id, session=session)
    if row is None:
        return None
    dag = row.dag
    _dags[dag_id] = (str(row.dag_hash), dag)
    return dag


def watched_dag(dag: Any, now: datetime, *, first_seen: datetime | None = None) -> WatchedDag:
    """A ``WatchedDag`` for a serialized Airflow DAG (runs expected from ``first_seen`` on)."""
    from airflow_plugins.protection.task_identity import dag_period, dag_timezone, schedule_step

    schedule = TimetableSchedule(dag.timetable)
    starts = [moment for moment in (dag.start_date, first_seen) if moment is not None]
    start = max(starts) if starts else None
    interval = schedule_interval(schedule, start or now) or timedelta(days=1)
    return WatchedDag(
        dag_id=dag.dag_id,
        schedule=schedule,
        # the same period and timezone the protected tasks key their leases with
        period=dag_period(dag),
        timezone=dag_timezone(dag),
        deadline=settings.deadline_for(dag.dag_id, interval),
        start=start,
        step=schedule_step(dag.timetable),
    )
