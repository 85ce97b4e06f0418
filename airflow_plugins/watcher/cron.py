"""A fast expansion of five-field cron expressions in UTC, for long gap-detection windows.

Airflow's timetables (and croniter under them) step one fire time at a time, so a year of an
hourly DAG (8,760 fire times) costs close to a second before any row is read. Expanding the
fields into sets and walking the calendar day by day gives the same fire times for a UTC
schedule in a few milliseconds. Only plain expressions in UTC take this path (numbers, ``*``,
lists, ranges, steps; the dom/dow "or" rule of cron); anything else, and every other timezone
(daylight-saving transitions), goes through Airflow's own timetable. A test checks this module
against Airflow's ``CronTriggerTimetable`` over a year of several expressions.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?$")
_ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def _field(text: str, low: int, high: int) -> tuple[set[int], bool]:
    """The values of one field and whether it was ``*`` (unrestricted)."""
    values: set[int] = set()
    for part in text.split(","):
        match = _FIELD.match(part)
        if not match:
            raise ValueError(f"unsupported cron field {text!r}")
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if base == "*":
            first, last = low, high
        elif "-" in base:
            first, last = (int(x) for x in base.split("-"))
        else:
            first = int(base)
            last = high if step_text else first
        if first < low or last > high or first > last or step < 1:
            raise ValueError(f"cron field {text!r} out of range")
        values.update(range(first, last + 1, step))
    return values, text == "*"


class UtcCron:
    """The fire times of a five-field cron expression in UTC.

    Raises:
        ValueError: the expression uses something this fast path does not expand.
    """

    def __init__(self, expression: str) -> None:
        fields = _ALIASES.get(expression.strip(), expression).split()
        if len(fields) != 5:
            raise ValueError(f"not a five-field cron expression: {expression!r}")
        parsed = [_field(f, lo, hi) for f, (lo, hi) in zip(fields, _BOUNDS, strict=True)]
        self.minutes = sorted(parsed[0][0])
        self.hours = sorted(parsed[1][0])
        self.days, days_any = parsed[2]
        self.months = parsed[3][0]
        dows, dows_any = parsed[4]
        self.dows = {d % 7 for d in dows}  # 0 and 7 are Sunday
        self.days_any, self.dows_any = days_any, dows_any

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        in_dom = day.day in self.days
        in_dow = (day.isoweekday() % 7) in self.dows
        if self.days_any and self.dows_any:
            return True
        if self.days_any:
            return in_dow
        if self.dows_any:
            return in_dom
        return in_dom or in_dow  # cron: both restricted means either

    def fires(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """Fire times in ``[start, end]`` (UTC), in order."""
        day = start.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        end = end.astimezone(UTC)
        while day <= end:
            if self._day_matches(day):
                for hour in self.hours:
                    for minute in self.minutes:
                        fire = day.replace(hour=hour, minute=minute)
                        if start <= fire <= end:
                            yield fire
            day += timedelta(days=1)


def fast_cron(timetable: object) -> UtcCron | None:
    """A ``UtcCron`` for an Airflow ``CronTriggerTimetable`` in UTC, else None."""
    if type(timetable).__name__ != "CronTriggerTimetable":
        return None
    if getattr(timetable, "_interval", None) not in (None, timedelta(0)):
        return None
    timezone = getattr(timetable, "_timezone", None)
    if getattr(timezone, "name", str(timezone)) not in ("UTC", "Etc/UTC", "+00:00"):
        return None
    expression = getattr(timetable, "_expression", None)
    if not isinstance(expression, str):
        return None
    try:
        return UtcCron(expression)
    except ValueError:
        return None
