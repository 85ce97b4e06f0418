"""The lease key of an Airflow task instance, resolved from its runtime context.

The business date comes from ``airflow_plugins.lease.keys.resolve_business_date``: the run conf's
``business_date`` (validated against the DAG's period), else the logical date in the DAG's
timezone cut to the DAG's period. The period is the operator's ``period`` if given, else a DAG
tag ``exactly-once-period:<period>``, else inferred from the DAG's schedule (hourly cron ->
hour, daily -> day, ...). A mapped task is keyed on its rendered ``map_index_template`` (a tenant
id), never on its position in the expanded list. Everything here is fixed at parse time or by the
run: no run conf can change which key a task takes, except by naming the business date.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_plugins.lease import Holder, InvalidLeaseInput
from airflow_plugins.lease.keys import (
    ALLOW_FUTURE_TAG,
    LeaseKey,
    Period,
    escape_map_key,
    first_day,
    lease_key,
    partitioned_date,
    resolve_business_date,
    split_partition,
)

PERIOD_TAG_PREFIX = "exactly-once-period:"
_PROBE_RUNS = 8


@dataclasses.dataclass(frozen=True)
class TaskTarget:
    """One try of a protected task instance and the business identity it works on.

    Attributes:
        key: the lease key.
        period: the DAG's business period.
        holder: this try as a lease holder.
        conf: the DAG run's conf.
        triggering_user: who triggered the DAG run (None for the scheduler).
        run_started_at: when the DAG run started.
    """

    key: LeaseKey
    period: Period
    holder: Holder
    conf: Mapping[str, Any]
    triggering_user: str | None
    run_started_at: datetime | None

    @property
    def business_date(self) -> str:
        """The business date of the key (``2024-02-15``; without a partitioned run's key)."""
        return split_partition(self.key.business_date)[0]

    @property
    def first_day(self) -> Any:
        """The calendar date the business date starts on (for the store's retention check)."""
        return first_day(self.key.business_date)


def dag_timezone(dag: Any) -> str:
    """The IANA name of the DAG's timezone (UTC when it has none)."""
    tz = getattr(dag, "timezone", None)
    name = getattr(tz, "name", None) or (str(tz) if tz is not None else "UTC")
    return "UTC" if name in ("+00:00", "Z") else name


def _schedule_interval(timetable: Any) -> timedelta | None:
    delta = getattr(timetable, "delta", None) or getattr(timetable, "_delta", None)
    if isinstance(delta, timedelta):
        return delta
    if delta is not None:  # a relativedelta: months/years
        months = getattr(delta, "months", 0) + 12 * getattr(delta, "years", 0)
        return timedelta(days=28 * months + getattr(delta, "days", 0)) if months else None
    expression = getattr(timetable, "expression", None) or getattr(timetable, "_expression", None)
    if not isinstance(expression, str):
        return None
    from croniter import croniter

    probe = croniter(expression, datetime(2024, 1, 1, tzinfo=UTC))
    fires = [probe.get_next(datetime) for _ in range(_PROBE_RUNS)]
    shortest: timedelta = min(b - a for a, b in itertools.pairwise(fires))
    return shortest


def schedule_step(timetable: Any) -> Any:
    """The fixed step of a delta timetable (``schedule=timedelta(days=1)``, a
    ``DeltaDataIntervalTimetable``): a ``timedelta`` or ``relativedelta``; None for any other.

    Airflow adds it in absolute time, so in a timezone with DST its runs drift across local
    periods and one may come twice (``keys.business_period`` marks the second).
    """
    if timetable is None or getattr(timetable, "expression", None) is not None:
        return None
    if getattr(timetable, "_expression", None) is not None:
        return None
    delta = getattr(timetable, "delta", None) or getattr(timetable, "_delta", None)
    if isinstance(delta, timedelta) or (delta is not None and hasattr(delta, "months")):
        return delta
    return None


def dag_period(dag: Any) -> Period:
    """The business period of a DAG: its ``exactly-once-period:`` tag, else its schedule's.

    DAGs with no regular schedule (manual, asset-triggered, ``@once``) default to a day.

    Raises:
        InvalidLeaseInput: a bad period tag.
    """
    for tag in getattr(dag, "tags", None) or ():
        if isinstance(tag, str) and tag.startswith(PERIOD_TAG_PREFIX):
            name = tag.removeprefix(PERIOD_TAG_PREFIX)
            try:
                return Period(name)
            except ValueError as exc:
                raise InvalidLeaseInput(f"DAG tag {tag!r}: unknown period {name!r}") from exc
    interval = _schedule_interval(getattr(dag, "timetable", None))
    if interval is None:
        return Period.DAY
    return Period.of_interval(interval)


def allows_future_dates(dag: Any) -> bool:
    """Whether the DAG declares (tag ``exactly-once-allow-future-dates``) that a run's conf may
    name a business date whose period has not begun."""
    return ALLOW_FUTURE_TAG in (getattr(dag, "tags", None) or ())


_ONE_NAME = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def _render_before_work(context: Mapping[str, Any], template: str) -> str:
    """Renders a map index template before the task runs, with the task's ``op_kwargs`` in
    scope (``{{ tenant }}`` for a task mapped over ``tenant``), as a Python task sees them.

    Airflow renders the template again after the work for the UI's label; the key uses this
    rendering, so the template must depend only on what is known before the work starts.
    """
    import jinja2

    values = dict(context)
    op_kwargs = getattr(context.get("task"), "op_kwargs", None)
    if isinstance(op_kwargs, Mapping):
        values.update(op_kwargs)
    env = context["dag"].get_template_env()
    # the common template, one name ("{{ tenant }}"), renders as str(value) in Jinja when the
    # environment neither escapes nor finalises: looked up directly, without compiling a
    # template (a few milliseconds of a task's start)
    simple = _ONE_NAME.fullmatch(template)
    if simple and simple[1] in values and env.autoescape is False and env.finalize is None:
        return str(values[simple[1]])
    try:
        return str(env.from_string(template).render(values))
    except jinja2.TemplateError as exc:
        raise InvalidLeaseInput(
            f"map_index_template {template!r} cannot be rendered before the work runs ({exc}); "
            "it names the lease key, so it may use only the task's arguments and the run's "
            "context, e.g. '{{ tenant }}' or \"{{ task.op_kwargs['tenant'] }}\""
        ) from exc


def map_key(context: Mapping[str, Any]) -> str | None:
    """The map key of a mapped task instance: its rendered ``map_index_template``.

    Raises:
        InvalidLeaseInput: a mapped protected task without a ``map_index_template``, or one that
            renders empty (a position would shift when the expanded list changes).
    """
    ti = context["ti"]
    if getattr(ti, "map_index", -1) is None or getattr(ti, "map_index", -1) < 0:
        return None
    rendered = getattr(ti, "rendered_map_index", None)
    template = context.get("map_index_template") or getattr(
        context.get("task"), "map_index_template", None
    )
    if rendered:
        # Airflow's own rendering includes the template's blanks: cut as before (a name that
        # differs only by its blanks then collides, and the collision check names both)
        rendered = str(rendered).strip()
    elif template:
        # the template's own blanks are not the item's: a name's blanks are part of its key
        rendered = _render_before_work(context, template.strip())
    if not rendered or not str(rendered).strip():
        raise InvalidLeaseInput(
            f"mapped task {ti.task_id!r} (map index {ti.map_index}) has no map_index_template: "
            "a protected mapped task must name each item, e.g. "
            "map_index_template='{{ task.op_kwargs[\"tenant\"] }}'"
        )
    return escape_map_key(rendered)


def run_moment(dag_run: Any) -> Any:
    """The instant a run's business date is cut from: its logical date or, for an
    asset-triggered run of a partitioned DAG (Airflow 3.3 gives it no logical date), the
    partition's date as Airflow resolved it. None when it has neither."""
    return getattr(dag_run, "logical_date", None) or getattr(dag_run, "partition_date", None)


def target_from_context(
    context: Mapping[str, Any],
    *,
    period: Period | str | None = None,
    timezone: str | None = None,
) -> TaskTarget:
    """The business identity of the running try described by ``context``.

    Raises:
        InvalidLeaseInput: a malformed conf ``business_date``, or one whose period has not begun
            (unless the DAG allows future dates); a manual run with no logical date and no
            ``business_date``; a mapped task with no ``map_index_template``.
    """
    dag = context["dag"]
    dag_run = context["dag_run"]
    ti = context["ti"]
    chosen = Period(period) if period is not None else dag_period(dag)
    conf: Mapping[str, Any] = getattr(dag_run, "conf", None) or {}
    business_date = resolve_business_date(
        conf,
        run_moment(dag_run),
        period=chosen,
        timezone=timezone or dag_timezone(dag),
        now=None if allows_future_dates(dag) else datetime.now(UTC),
        step=schedule_step(getattr(dag, "timetable", None)),
    )
    # a partitioned run (Airflow 3.3) keys its partition after the date: the bridge keys alike
    partition = getattr(dag_run, "partition_key", None)
    key = lease_key(
        ti.dag_id, ti.task_id, partitioned_date(business_date, partition), map_key(context)
    )
    return TaskTarget(
        key=key,
        period=chosen,
        holder=try_holder(ti),
        conf=conf,
        triggering_user=getattr(dag_run, "triggering_user_name", None),
        run_started_at=getattr(dag_run, "start_date", None),
    )


def try_holder(ti: Any) -> Holder:
    """The lease holder for one try of a task instance (the task SDK's or the ORM's)."""
    map_index = getattr(ti, "map_index", -1)
    return Holder.airflow(
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        map_index=-1 if map_index is None else map_index,
        try_number=int(getattr(ti, "try_number", 0) or 0),
    )
