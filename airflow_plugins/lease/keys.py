"""The one function that names a business execution: its lease key.

Every engine builds keys here (the Airflow operator, the policy, the listener and the Temporal
bridge), so the same business work maps to the same key whoever runs it: a second DAG run, a
cleared task, a new try and a Temporal activity of the same business date all collide.

    billing_nightly/charge/2024-02-15
    tenant_webhooks/send/2024-02-15T03/tenant-42

Imports nothing from Airflow.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from airflow_plugins.lease.errors import InvalidLeaseInput

MAX_KEY_CHARS = 512
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHADOW_SUFFIX = "#shadow"
# the DAG tag that lets a run's conf name a business date whose period has not begun
ALLOW_FUTURE_TAG = "exactly-once-allow-future-dates"
_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")
# each period's text, with the ".fold" mark of a second occurrence (see business_period)
_PERIOD_TEXT = {
    "minute": re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(\.fold)?$"),
    "hour": re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}(\.fold)?$"),
    "day": re.compile(r"^\d{4}-\d{2}-\d{2}(\.fold)?$"),
    "week": re.compile(r"^\d{4}-W\d{2}(\.fold)?$"),
    "month": re.compile(r"^\d{4}-\d{2}(\.fold)?$"),
    "quarter": re.compile(r"^\d{4}-Q[1-4](\.fold)?$"),
    "year": re.compile(r"^\d{4}(\.fold)?$"),
}


class Period(enum.StrEnum):
    """The grain of a DAG's business date: what one scheduled run stands for."""

    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    QUARTER = "quarter"
    YEAR = "year"

    @classmethod
    def of_interval(cls, interval: timedelta) -> Period:
        """The coarsest period not longer than a schedule's interval (hourly -> hour)."""
        if interval < timedelta(hours=1):
            return cls.MINUTE
        if interval < timedelta(days=1):
            return cls.HOUR
        if interval < timedelta(days=7):
            return cls.DAY
        if interval < timedelta(days=28):
            return cls.WEEK
        if interval < timedelta(days=90):
            return cls.MONTH
        if interval < timedelta(days=365):
            return cls.QUARTER
        return cls.YEAR


_ESCAPED_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")


def escape_map_key(name: object) -> str:
    """The map-key form of an item's name (a tenant id): injective, so two names never share a key.

    Percent-escapes only what a key part cannot hold or what would make two names alike: ``/``
    (the key's separator), control characters, blanks at either end, a ``%`` that already
    reads as an escape (``%2F`` becomes ``%252F``), and the ``#`` of a name ending in
    ``#shadow`` (it would key as the shadow of the name without it). Every other name keys as
    itself, so keys recorded for such names still match. Both engines key mapped items through
    this function.

    >>> escape_map_key("acme/eu"), escape_map_key("acme_eu "), escape_map_key("tenant-42")
    ('acme%2Feu', 'acme_eu%20', 'tenant-42')

    Raises:
        InvalidLeaseInput: the name is empty or only blanks.
    """
    text = str(name)
    if not text.strip():
        raise InvalidLeaseInput(f"a mapped item's name {text!r} must not be empty or blank")
    lead = len(text) - len(text.lstrip())
    trail = len(text.rstrip())
    shadow_mark = len(text) - len(SHADOW_SUFFIX) if text.endswith(SHADOW_SUFFIX) else -1
    out: list[str] = []
    for i, ch in enumerate(text):
        if (
            i == shadow_mark
            or ch == "/"
            or ord(ch) < 0x20
            or ord(ch) == 0x7F
            or i < lead
            or i >= trail
            or (ch == "%" and _ESCAPED_PERCENT.match(text, i))
        ):
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


FOLD_SUFFIX = ".fold"
# how long a period lasts at least: a step shorter than its period repeats it on purpose
_SHORTEST = {
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(hours=23),
    "week": timedelta(days=7) - timedelta(hours=1),
    "month": timedelta(days=28) - timedelta(hours=1),
    "quarter": timedelta(days=89) - timedelta(hours=1),
    "year": timedelta(days=365) - timedelta(hours=1),
}


def _period_text(local: datetime, period: Period) -> str:
    if period is Period.MINUTE:
        return local.strftime("%Y-%m-%dT%H:%M")
    if period is Period.HOUR:
        return local.strftime("%Y-%m-%dT%H")
    if period is Period.DAY:
        return local.strftime("%Y-%m-%d")
    if period is Period.WEEK:
        year, week, _ = local.isocalendar()
        return f"{year}-W{week:02d}"
    if period is Period.MONTH:
        return local.strftime("%Y-%m")
    if period is Period.QUARTER:
        return f"{local.year}-Q{(local.month - 1) // 3 + 1}"
    return f"{local.year}"


def business_period(
    moment: datetime, period: Period, timezone: str = "UTC", *, step: Any = None
) -> str:
    """The business date of ``moment`` in the DAG's timezone, cut to ``period``.

    A period that comes twice keys its second occurrence with ``.fold`` after the first one's
    text, so two periods never share a key and every other key keeps its text:

    - a local minute or hour repeated when the clocks go back (``2024-10-27T02.fold`` is 02:00
      to 03:00 CET, after 02:00 to 03:00 CEST in Europe/Berlin);
    - with ``step`` (a schedule that advances by a fixed ``timedelta``/``relativedelta`` of
      absolute time, as Airflow's delta timetables do), a run whose previous run fell in the
      same local period (a daily step from summer midnight runs at 00:00 CEST and 23:00 CET on
      2024-10-27: ``2024-10-27`` and ``2024-10-27.fold``). A step shorter than the period (an
      hourly schedule keyed by day) groups its runs on purpose and is not marked.

    >>> business_period(datetime(2024, 2, 15, 2, 0, tzinfo=ZoneInfo("UTC")), Period.DAY)
    '2024-02-15'
    """
    if moment.tzinfo is None:
        raise InvalidLeaseInput("a logical date must be timezone-aware")
    zone = _zone(timezone)
    local = moment.astimezone(zone)
    text = _period_text(local, period)
    if period in (Period.MINUTE, Period.HOUR) and local.fold:
        return text + FOLD_SUFFIX
    if step is not None:
        previous = moment - step
        if moment - previous >= _SHORTEST[period.value] and (
            _period_text(previous.astimezone(zone), period) == text
        ):
            return text + FOLD_SUFFIX
    return text


#: Between a business date and a run's asset partition key in a key's date part (Airflow 3.3's
#: partitioned DAGs run once per partition: regions ``us`` and ``eu`` of one day are two runs).
PARTITION_SEPARATOR = "@"


def partitioned_date(business_date: str, partition_key: str | None) -> str:
    """The date part of a partitioned run's keys: the business date, ``@``, the partition key.

    The key is escaped as a mapped item's name is (``escape_map_key``: a ``/`` or a trailing
    ``#shadow`` cannot break the key), so two partitions never share a key. No partition: the
    business date itself, so every key of a run without one is what it always was.

    >>> partitioned_date("2024-02-15", "us"), partitioned_date("2024-02-15", None)
    ('2024-02-15@us', '2024-02-15')
    """
    if not partition_key:  # None, or an empty key (Airflow's runs without one)
        return business_date
    return f"{business_date}{PARTITION_SEPARATOR}{escape_map_key(partition_key)}"


def split_partition(date_part: str) -> tuple[str, str | None]:
    """A key's date part as its business date and its (escaped) partition key, if any."""
    business_date, separator, partition = date_part.partition(PARTITION_SEPARATOR)
    return business_date, partition if separator else None


def split_fold(business_date: str) -> tuple[str, bool]:
    """A business date's text without its ``.fold`` mark, and whether it had one."""
    if business_date.endswith(FOLD_SUFFIX):
        return business_date.removesuffix(FOLD_SUFFIX), True
    return business_date, False


def parse_business_date(text: object, period: Period) -> str:
    """Validates a ``business_date`` given in a run's conf against the DAG's period.

    Accepts the period's own form (``2024-02-15`` for a daily DAG, ``2024-02`` for a monthly
    one); for a daily DAG the date must exist in the calendar.

    Raises:
        InvalidLeaseInput: the text is not a business date of that period.
    """
    if not isinstance(text, str) or not _PERIOD_TEXT[period.value].match(text):
        example = business_period(datetime(2024, 2, 15, 3, tzinfo=ZoneInfo("UTC")), period)
        raise InvalidLeaseInput(
            f"business_date {text!r} is not a {period.value} business date (e.g. {example!r})"
        )
    try:
        first_day(text)
    except ValueError as exc:
        raise InvalidLeaseInput(f"business_date {text!r} is not a real date: {exc}") from exc
    return text


def first_day(business_date: str) -> date:
    """The calendar date a business date (or a partitioned key's date part) starts on (for
    retention checks and queries)."""
    business_date = split_fold(split_partition(business_date)[0])[0]
    if "-W" in business_date:
        year, week = business_date.split("-W")
        return date.fromisocalendar(int(year), int(week), 1)
    if "-Q" in business_date:
        year, quarter = business_date.split("-Q")
        return date(int(year), 3 * (int(quarter) - 1) + 1, 1)
    if "T" in business_date:
        return date.fromisoformat(business_date.split("T")[0])
    parts = [int(p) for p in business_date.split("-")]
    return date(parts[0], parts[1] if len(parts) > 1 else 1, parts[2] if len(parts) > 2 else 1)


def _zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidLeaseInput(f"unknown timezone {timezone!r}") from exc


def period_start(business_date: str, period: Period, timezone: str = "UTC") -> datetime:
    """The instant a business date's period begins in the DAG's timezone (timezone-aware UTC).

    The second occurrence of a repeated hour or minute starts at its own instant; a repeated
    day, week, month... (``2024-10-27.fold``) is counted from the end of its local period, as its
    run starts somewhere within it.

    Raises:
        InvalidLeaseInput: the text is not a business date of that period, or a bad timezone.
    """
    text, fold = split_fold(parse_business_date(business_date, period))
    zone = _zone(timezone)
    if period is Period.MINUTE:
        naive = datetime.strptime(text, "%Y-%m-%dT%H:%M")
    elif period is Period.HOUR:
        naive = datetime.strptime(text, "%Y-%m-%dT%H")
    else:
        naive = datetime.combine(first_day(text), time())
        if fold:  # a repeated day (or week...) starts within it: count it from its end
            naive = datetime.combine(_period_end(first_day(text), period), time())
            fold = False
    return naive.replace(tzinfo=zone, fold=int(fold)).astimezone(UTC)


def _period_end(first: date, period: Period) -> date:
    if period is Period.DAY:
        return first + timedelta(days=1)
    if period is Period.WEEK:
        return first + timedelta(days=7)
    months = {Period.MONTH: 1, Period.QUARTER: 3}.get(period, 12)
    index = first.year * 12 + first.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


def resolve_business_date(
    conf: Mapping[str, Any] | None,
    logical_date: datetime | None,
    *,
    period: Period,
    timezone: str = "UTC",
    now: datetime | None = None,
    step: Any = None,
) -> str:
    """The business date of a run: the conf's ``business_date`` if given, else the logical date.

    Args:
        conf: the run's conf.
        logical_date: the run's logical date (None for a manual run without one).
        period: the DAG's business period.
        timezone: the DAG's timezone.
        now: when given, a conf ``business_date`` whose period begins after ``now`` is refused:
            a run cannot claim a period that has not begun (the real run of that date would be
            handed "already succeeded"). None allows it (a DAG that declares future dates).
        step: a delta schedule's step (see ``business_period``).

    Raises:
        InvalidLeaseInput: the conf's date is malformed or (with ``now``) not begun yet, or there
            is neither (a manual run of a protected DAG must name its business date).
    """
    given = (conf or {}).get("business_date")
    if given is not None:
        text = parse_business_date(given, period)
        if now is not None:
            start = period_start(text, period, timezone)
            if start > now:
                local = start.astimezone(_zone(timezone)).isoformat(timespec="minutes")
                raise InvalidLeaseInput(
                    f"business_date {text!r} has not begun: its {period.value} starts at "
                    f"{local} ({timezone}). A run cannot claim a business date before its "
                    "period starts (the scheduled run of that date would find it taken); a DAG "
                    f"that means to run ahead declares it with the tag {ALLOW_FUTURE_TAG!r}"
                )
        return text
    if logical_date is None:
        raise InvalidLeaseInput(
            "this run has no logical date and its conf names no business_date: a protected "
            'run must say which business date it is for, e.g. {"business_date": "2024-02-15"}'
        )
    return business_period(logical_date, period, timezone, step=step)


@dataclasses.dataclass(frozen=True)
class LeaseKey:
    """The business identity of one execution.

    Attributes:
        dag_id: the DAG (or workflow family) the work belongs to.
        task_id: the task within it.
        business_date: the business date, cut to the DAG's period.
        map_key: for mapped tasks, the rendered map index template (a tenant id, never a
            position in a list that can shift).
    """

    dag_id: str
    task_id: str
    business_date: str
    map_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("dag_id", "task_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _PART.match(value):
                raise InvalidLeaseInput(f"{name} {value!r} is not a valid identifier")
        if not isinstance(self.business_date, str) or not self.business_date:
            raise InvalidLeaseInput("a lease key needs a business date")
        if self.map_key is not None and (not self.map_key or "/" in self.map_key):
            raise InvalidLeaseInput(f"map key {self.map_key!r} must be non-empty with no '/'")
        check_key(str(self))

    def __str__(self) -> str:
        parts = [self.dag_id, self.task_id, self.business_date]
        if self.map_key is not None:
            parts.append(self.map_key)
        return "/".join(parts)

    @property
    def shadow(self) -> str:
        """The key a shadow run (dual-run cutover) leases instead of the primary's."""
        return str(self) + SHADOW_SUFFIX

    @classmethod
    def parse(cls, text: str) -> LeaseKey:
        """Reads a key back from its text form."""
        parts = check_key(text).removesuffix(SHADOW_SUFFIX).split("/")
        if len(parts) not in (3, 4):
            raise InvalidLeaseInput(f"{text!r} is not dag/task/business_date[/map_key]")
        return cls(*parts)


def lease_key(
    dag_id: str, task_id: str, business_date: str, map_key: str | None = None
) -> LeaseKey:
    """Builds the lease key of one business execution (see ``LeaseKey``)."""
    return LeaseKey(dag_id, task_id, business_date, map_key)


def check_key(key: object) -> str:
    """Validates a lease key: 1 to 512 characters of text with no control characters.

    Raises:
        InvalidLeaseInput: the key is not such a string.
    """
    if not isinstance(key, str):
        raise InvalidLeaseInput(f"a lease key must be a string, not {type(key).__name__}")
    if not key.strip():
        raise InvalidLeaseInput("a lease key must not be empty")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidLeaseInput(f"a lease key must be at most {MAX_KEY_CHARS} characters")
    if _CONTROL.search(key):
        raise InvalidLeaseInput("a lease key must not contain control characters")
    return key
