"""Eight real OS processes racing over the same 1,000 keys, checked from the audit trail."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

WORKER = Path(__file__).with_name("race_worker.py")
PROCESSES = 8
KEYS = 1000
TTL = 0.5

AUDIT = """
SELECT id, key, event, outcome, token, at,
       substring(reason from 'from token ([0-9]+),')::bigint AS previous_token,
       substring(reason from 'expired at (.*)$')::timestamptz AS previous_expiry
FROM runlease.audit ORDER BY key, id
"""


@dataclass
class Grant:
    """An open [grant, finish] interval of one holder on one key."""

    token: int
    at: datetime


def _grant_problems(
    key: str, outcome: object, token: int, at: datetime, row: tuple[object, ...], held: Grant | None
) -> list[str]:
    """What is wrong with a grant, given the interval still open when it came."""
    previous_token, previous_expiry = row[6], row[7]
    if outcome == "granted" and held is not None:
        return [f"{key}: granted to {token} while {held.token} holds it"]
    if outcome != "taken_over":
        return []
    # the previous holder's interval ended at its expiry, before this grant
    if held is None or previous_token != held.token:
        return [f"{key}: takeover of {previous_token}, holder {held}"]
    if not (isinstance(previous_expiry, datetime) and held.at < previous_expiry < at):
        return [f"{key}: took over at {at}, before expiry {previous_expiry}"]
    return []


def _check_key(key: str, rows: Sequence[tuple[object, ...]]) -> list[str]:
    """Replays one key's audit in commit order (id order); returns what is wrong with it."""
    problems: list[str] = []
    held: Grant | None = None
    last_grant_token = 0
    last_token = 0
    completes = 0
    for row in rows:
        _id, _key, event, outcome, token, at = row[:6]
        assert isinstance(at, datetime)
        if isinstance(token, int):
            if token < last_token:
                problems.append(f"{key}: token {token} after {last_token} (id {_id})")
            last_token = token
        if event == "acquire" and outcome in ("granted", "taken_over"):
            assert isinstance(token, int)
            if token <= last_grant_token:
                problems.append(f"{key}: granted token {token} not above {last_grant_token}")
            last_grant_token = token
            problems += _grant_problems(key, outcome, token, at, row, held)
            held = Grant(token, at)
        elif event in ("complete", "fail", "release"):
            if held is None or token != held.token:
                problems.append(f"{key}: {event} by token {token}, holder {held}")
            held = None
            completes += event == "complete"
    if completes != 1:
        problems.append(f"{key}: completed {completes} times")
    if held is not None:
        problems.append(f"{key}: still held by {held.token} at the end")
    return problems


@pytest.mark.slow
def test_eight_processes_racing_over_1000_keys(lease_db: str) -> None:
    start_at = time.time() + 4.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                lease_db,
                str(w),
                str(KEYS),
                str(TTL),
                str(start_at),
                str(w),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(PROCESSES)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * PROCESSES, [e[-2000:] for _, e in outputs]
    tallies = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    with psycopg.connect(lease_db) as conn:
        rows = conn.execute(AUDIT).fetchall()
        states = conn.execute(
            "SELECT state, count(*) FROM runlease.lease GROUP BY state"
        ).fetchall()
    by_key: dict[str, list[tuple[object, ...]]] = defaultdict(list)
    for row in rows:
        by_key[str(row[1])].append(row)

    problems = [p for key, key_rows in by_key.items() for p in _check_key(key, key_rows)]
    assert problems == []
    assert len(by_key) == KEYS
    assert dict(states) == {"succeeded": KEYS}
    # every key succeeded exactly once, as the processes saw it too
    assert sum(t["completed"] for t in tallies) == KEYS
    # the race was real: processes collided, failed keys were granted again, expired
    # holders were taken over and their late completes refused
    outcomes: defaultdict[str, int] = defaultdict(int)
    for row in rows:
        outcomes[str(row[3])] += 1
    assert outcomes["held"] > 0
    assert outcomes["taken_over"] > 0
    assert sum(t["failed"] for t in tallies) > 0
    assert sum(t["zombie_lost"] for t in tallies) > 0
    assert len({t["pid"] for t in tallies}) == PROCESSES
    assert sum(1 for t in tallies if t["completed"] > 0) >= PROCESSES // 2


def test_the_audit_check_catches_overlaps_and_double_completes() -> None:
    """The checker above must be able to fail: feed it histories that break each rule."""
    t = [datetime(2024, 2, 15, 2, 0, s) for s in range(10)]
    ok = [
        (1, "k", "acquire", "granted", 5, t[0], None, None),
        (2, "k", "acquire", "held", 5, t[1], None, None),
        (3, "k", "acquire", "taken_over", 7, t[3], 5, t[2]),
        (4, "k", "complete", "succeeded", 7, t[4], None, None),
    ]
    assert _check_key("k", ok) == []
    overlap = [ok[0], (2, "k", "acquire", "granted", 6, t[1], None, None), ok[3]]
    early = [ok[0], (3, "k", "acquire", "taken_over", 7, t[3], 5, t[5]), ok[3]]
    stale = [*ok, (5, "k", "complete", "succeeded", 5, t[5], None, None)]
    backwards = [(1, "k", "acquire", "granted", 9, t[0], None, None), *ok[2:]]
    unfinished = ok[:3]
    for history in (overlap, early, stale, backwards, unfinished):
        assert _check_key("k", history) != []
