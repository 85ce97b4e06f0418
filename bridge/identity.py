"""Names derived from the lease key: workflow ids, item keys. Built only through ``keys``."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from airflow_plugins.lease import InvalidLeaseInput
from airflow_plugins.lease.keys import LeaseKey, Period, business_period, escape_map_key, lease_key
from bridge.partition import keyed_date
from bridge.spec import RUN_TASK_ID, DagSpec, RunMode

WORKFLOW_ID_PREFIX = "dagrun:"


def run_key(dag_id: str, business_date: str, partition_key: str | None = None) -> LeaseKey:
    """The key of a whole business run of a DAG (``billing_nightly/dagrun/2024-02-15``; one
    partition's: ``ingest_region_stats/dagrun/2024-02-15@us``)."""
    return lease_key(dag_id, RUN_TASK_ID, keyed_date(business_date, partition_key))


def tick_business_date(spec: DagSpec, nominal: datetime) -> str:
    """The business date of a Temporal Schedule's tick (``temporal-scheduled`` mode), from the
    tick's nominal time: the key Airflow gave the same run.

    A cron trigger's run is keyed by its fire time; a ``CronDataIntervalTimetable`` run by the
    start of the interval the tick closes (the previous fire, found as Airflow's own timetable
    finds it), so both engines key the run alike.
    """
    moment = nominal
    if spec.timetable == "CronDataIntervalTimetable" and spec.schedule:
        moment = _interval_start(spec.schedule, spec.timezone, nominal)
    return business_period(moment, Period(spec.period), spec.timezone)


def _interval_start(expression: str, timezone: str, end: datetime) -> datetime:
    """The cron fire before ``end``, as Airflow's ``CronMixin._get_prev`` computes it: a cron
    that fires every hour steps back in absolute time (across a fold), any other is read on the
    local wall clock."""
    zone = ZoneInfo(timezone)
    end = datetime.fromtimestamp(end.timestamp(), UTC)  # a plain datetime (not pendulum's)
    local = end.astimezone(zone)
    naive = local.replace(tzinfo=None)
    cron = croniter(expression, start_time=naive)
    previous: datetime = cron.get_prev(datetime)
    if cron.expanded[1] == ["*"]:
        start: datetime = end - (naive - previous)
        return start
    return previous.replace(tzinfo=zone).astimezone(UTC)


def workflow_id(
    dag_id: str,
    business_date: str,
    mode: RunMode = RunMode.PRIMARY,
    *,
    part: str | None = None,
    map_key: str | None = None,
    partition_key: str | None = None,
) -> str:
    """The workflow id of a business run: one execution per key (and one per shadow key).

    Args:
        dag_id: the DAG.
        business_date: the run's business date.
        mode: a shadow run has an id of its own (the shadow key's).
        part: the task id when one task of the run is handed over (its lease key's id);
            None for the whole run.
        map_key: the mapped item, for one item of a mapped task.
        partition_key: the Airflow run's asset partition: each partition of a business date
            is a run of its own (``bridge.partition.keyed_date``); None: the id as before.
    """
    key = lease_key(dag_id, part or RUN_TASK_ID, keyed_date(business_date, partition_key), map_key)
    return WORKFLOW_ID_PREFIX + (key.shadow if mode is RunMode.SHADOW else str(key))


def task_lease_key(
    dag_id: str,
    task_id: str,
    business_date: str,
    map_key: str | None,
    mode: RunMode,
    partition_key: str | None = None,
) -> str:
    """The lease key an activity takes: the Airflow operator's key, or its shadow (with the
    run's partition after the business date, when it has one)."""
    key = lease_key(dag_id, task_id, keyed_date(business_date, partition_key), map_key)
    return key.shadow if mode is RunMode.SHADOW else str(key)


def map_key_of(value: Any, field: str | None) -> str:
    """The stable name of one mapped item in its lease key (a tenant id, never a position).

    Raises:
        InvalidLeaseInput: the item has no usable name.
    """
    if field is not None:
        if not isinstance(value, dict) or field not in value:
            raise InvalidLeaseInput(f"mapped item {value!r} has no field {field!r} to key it by")
        value = value[field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidLeaseInput(
            f"mapped item {value!r} is not a string or integer: set map_key_field to name it"
        )
    return escape_map_key(value)


def map_items(values: list[Any], field: str | None) -> tuple[tuple[str, Any], ...]:
    """Each mapped item with its map key, in order.

    Raises:
        InvalidLeaseInput: an item has no usable name, or two items key alike (the error names
            both: the second would be handed the first one's result and never run).
    """
    return _unique(values, lambda value: map_key_of(value, field), "a name of its own")


def _unique(
    values: list[Any], key_of: Callable[[Any], str], needs: str
) -> tuple[tuple[str, Any], ...]:
    """Each value with its key, in order; two values keying alike are refused, naming both
    (the second would be handed the first one's result and never run)."""
    items: list[tuple[str, Any]] = []
    first: dict[str, int] = {}
    for index, value in enumerate(values):
        key = key_of(value)
        if key in first:
            raise InvalidLeaseInput(
                f"mapped item {first[key]} ({values[first[key]]!r}) and item {index} "
                f"({value!r}) both key as {key!r}: each item of a mapped task needs {needs}"
            )
        first[key] = index
        items.append((key, value))
    return tuple(items)


def expand_key(arguments: dict[str, Any]) -> str:
    """The name of one item of an ``expand()`` that is not one argument over one upstream list:
    the item itself when it is one string or integer argument (as an upstream list's item is
    keyed), else ``args-`` and a digest of its arguments (names and values). Never its position:
    a list reordered between two attempts must not hand one item's record to another."""
    if len(arguments) == 1:
        (value,) = arguments.values()
        if isinstance(value, str | int) and not isinstance(value, bool):
            return escape_map_key(value)
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=repr)
    return "args-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def expanded_items(lists: dict[str, list[Any]]) -> tuple[tuple[str, Any], ...]:
    """The items of an ``expand()`` over ``lists`` (argument -> its values): their cross product
    in Airflow's map index order (the last argument varies fastest), each an argument dict with
    its ``expand_key``.

    Raises:
        InvalidLeaseInput: two items have the same arguments (they would key alike: the second
            would be handed the first one's result and never run).
    """
    combos = itertools.product(*lists.values())
    return keyed_items([dict(zip(lists, values, strict=True)) for values in combos])


def keyed_items(argument_sets: list[dict[str, Any]]) -> tuple[tuple[str, Any], ...]:
    """Mapped items given as argument dicts (an ``expand_kwargs`` list, or ``expanded_items``'
    cross product), each with its ``expand_key``, in their order.

    Raises:
        InvalidLeaseInput: two items have the same arguments.
    """
    return _unique(
        argument_sets, expand_key, "arguments of its own (items with the same arguments key alike)"
    )
