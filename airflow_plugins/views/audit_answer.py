"""The answer to "did ``billing_nightly`` run for 2024-02-15, exactly once?" from the audit trail.

One business run is one key per protected task (``dag/task/date[/map]``). A key ran exactly once
when exactly one try completed it (event ``complete``); a second completion can only follow an
administrator's approved re-run, and is shown as such. Tries that failed, were taken over or
blocked as duplicates are listed with their tokens, so the answer shows why it is exactly once.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from airflow_plugins.lease import Holder
from airflow_plugins.lease.keys import SHADOW_SUFFIX

GRANTS = ("granted", "taken_over")
BLOCKED = ("held", "succeeded", "refused")
ENDINGS = ("complete", "fail", "release", "fail_on_behalf", "force_release")


class Verdict(enum.StrEnum):
    """The answer for one key or a whole run."""

    EXACTLY_ONCE = "exactly once"
    NOT_RUN = "not run"
    RUNNING = "running"
    MORE_THAN_ONCE = "more than once"


@dataclasses.dataclass
class Try:
    """One grant of a key's lease and what became of it."""

    token: int | None
    holder: str
    granted_at: datetime
    outcome: str = "running"
    ended_at: datetime | None = None
    duration_ms: int | None = None
    input: Any = None
    output: Any = None
    detail: str | None = None


@dataclasses.dataclass
class KeyAnswer:
    """The audit of one key: its tries, blocked duplicates and verdict."""

    key: str
    shadow: bool
    tries: list[Try]
    completions: int
    blocked: int
    approved_reruns: int
    rows: list[Mapping[str, Any]]
    state: str | None

    @property
    def verdict(self) -> Verdict:
        """Exactly once, not run, still running, or more than once."""
        if self.completions == 1:
            return Verdict.EXACTLY_ONCE
        if self.completions > 1:
            return Verdict.MORE_THAN_ONCE
        return Verdict.RUNNING if self.state == "running" else Verdict.NOT_RUN


@dataclasses.dataclass
class RunAnswer:
    """The audit of one DAG's business date.

    Attributes:
        keys: one answer per protected key (``dag/task/date[/map]``, shadow keys included).
        run_events: rows about DAG runs as a whole, under pseudo-task keys such as
            ``dag/_dag_run/date``: runs started and finished, second runs of the date flagged
            as duplicates (the listener), runs the watcher reported missed.
    """

    dag_id: str
    business_date: str
    keys: list[KeyAnswer]
    run_events: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def primary(self) -> list[KeyAnswer]:
        """The keys whose effects count (shadow keys excluded)."""
        return [k for k in self.keys if not k.shadow]

    @property
    def verdict(self) -> Verdict:
        """Exactly once only when every primary key ran exactly once."""
        verdicts = {k.verdict for k in self.primary}
        if not verdicts:
            return Verdict.NOT_RUN
        for worst in (Verdict.MORE_THAN_ONCE, Verdict.RUNNING, Verdict.NOT_RUN):
            if worst in verdicts:
                return worst
        return Verdict.EXACTLY_ONCE


def describe_holder(holder: Mapping[str, Any] | None) -> str:
    """A holder as one line (``dag.task[-1] run try 2 on host pid 42``)."""
    if not holder:
        return "-"
    try:
        return Holder.from_json(dict(holder)).describe()
    except TypeError:
        return str(dict(holder))


def answer(
    dag_id: str,
    business_date: str,
    rows: Iterable[Mapping[str, Any]],
    leases: Iterable[Mapping[str, Any]],
) -> RunAnswer:
    """Builds the answer from ``audit_of_run`` rows (oldest first) and ``leases_of_run`` rows."""
    states = {lease["key"]: lease["state"] for lease in leases}
    by_key: dict[str, KeyAnswer] = {}
    run_events: list[Mapping[str, Any]] = []
    for row in rows:
        key = row["key"]
        if key.split("/")[1].startswith("_"):  # a pseudo-task: the DAG run as a whole
            run_events.append(row)
            continue
        entry = by_key.setdefault(
            key,
            KeyAnswer(key, key.endswith(SHADOW_SUFFIX), [], 0, 0, 0, [], states.get(key)),
        )
        entry.rows.append(row)
        _apply(entry, row)
    keys = sorted(by_key.values(), key=lambda k: k.key)
    return RunAnswer(dag_id, business_date, keys, run_events)


def _apply(entry: KeyAnswer, row: Mapping[str, Any]) -> None:
    event, outcome = row["event"], row["outcome"]
    if event == "acquire" and outcome in GRANTS:
        if outcome == "taken_over" and entry.tries and entry.tries[-1].outcome == "running":
            # the previous try's lease expired: this grant superseded it
            entry.tries[-1].outcome = "superseded"
            entry.tries[-1].ended_at = row["at"]
        entry.tries.append(
            Try(
                token=row["token"],
                holder=describe_holder(row["holder"]),
                granted_at=row["at"],
                input=row["input"],
                detail=row["reason"],
            )
        )
        return
    if event == "acquire" and outcome in BLOCKED:
        entry.blocked += 1
        return
    if event == "approve_rerun":
        entry.approved_reruns += 1
        return
    current = next((t for t in reversed(entry.tries) if t.token == row["token"]), None)
    if current is not None and event in ENDINGS:
        current.outcome = outcome or event
        current.ended_at = row["at"]
        current.duration_ms = row["duration_ms"]
        current.output = row["output"]
        current.detail = row["reason"] or current.detail
    if event == "complete":
        entry.completions += 1
