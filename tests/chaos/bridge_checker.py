"""The bridge campaign's independent checker: the sink's charges and Temporal's final states.

It reads what a user would look at: the sink's ``charges`` rows (each with the run key, the
customer and the writer's token, in commit order per key) and its fence ledger, and, from the
Temporal server, each handed-over business run's final state and how many executions its
workflow id has. It judges the charges with the lease-level checker's rules
(``tests.chaos.checker.check``: duplicates, stale writes, missed customers, wedged keys, per
fault kind) and adds the engine's side: every workflow closed completed, one execution per
business run; and the shadows' (every shadow closed completed, no sink row written by a
shadow run, whose writes are rolled back, and none outside the primaries' keys). It does not
import the lease package or the bridge and never reads the lease store: those are under test.

    .venv/bin/python -m tests.chaos.bridge_checker --sink-dsn URL --temporal HOST:PORT --log LOG

Its last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import psycopg
from temporalio.client import Client, WorkflowExecutionStatus

from tests.chaos.checker import check, print_verdict, violations

ROWS = (
    "SELECT id, run_key, customer, token, extract(epoch FROM at)::float8, writer"
    " FROM charges ORDER BY run_key, id"
)
LEDGER = "SELECT count(*) FROM runfence.ledger"


async def temporal_states(address: str, workflow_ids: list[str]) -> dict[str, Any]:
    """Each workflow id's final status and its number of executions, as Temporal shows them."""
    client = await Client.connect(address)
    states: dict[str, str] = {}
    executions: dict[str, int] = {}
    for wid in workflow_ids:
        described = await client.get_workflow_handle(wid).describe()
        status = described.status
        states[wid] = status.name if status is not None else "UNKNOWN"
        executions[wid] = len([w async for w in client.list_workflows(f'WorkflowId = "{wid}"')])
    return {"states": states, "executions": executions}


def judge(
    rows: list[tuple[Any, ...]], ledger: int, log: dict[str, Any], temporal: dict[str, Any]
) -> dict[str, Any]:
    """The verdict: the charges judged per key and fault kind, and Temporal's side."""
    report = check([row[:5] for row in rows], log)
    shadows = set(log.get("shadows", []))
    states: dict[str, str] = {w: s for w, s in temporal["states"].items() if w not in shadows}
    executions: dict[str, int] = temporal["executions"]
    completed = WorkflowExecutionStatus.COMPLETED.name
    shadow_states = [s for w, s in temporal["states"].items() if w in shadows]
    report.update(
        shadow_workflows=len(shadow_states),
        shadows_not_completed=sum(1 for s in shadow_states if s != completed),
        # a shadow's writes are rolled back: a row its run wrote (writer shadow:<pid>) leaked
        shadow_rows_leaked=sum(1 for row in rows if str(row[5] or "").startswith("shadow:")),
        rows_outside_runs=sum(1 for row in rows if row[1] not in log["keys"]),
    )
    report.update(
        workflows=len(states),
        workflows_not_completed=sum(1 for s in states.values() if s != completed),
        not_completed=sorted(w for w, s in states.items() if s != completed)[:10],
        extra_executions=sum(max(0, n - 1) for n in executions.values()),
        charges=len(rows),
        ledger_rows=ledger,
        handovers=log.get("handovers", 0),
        duplicate_handovers_started=log.get("duplicate_started", 0),
        worker_processes=log.get("worker_processes", 0),
    )
    return report


def bad(report: dict[str, Any]) -> int:
    """How many violations the verdict holds (duplicates included)."""
    return (
        violations(report)
        + report["workflows_not_completed"]
        + report["extra_executions"]
        + report.get("shadows_not_completed", 0)
        + report.get("shadow_rows_leaked", 0)
        + report.get("rows_outside_runs", 0)
    )


def main(argv: list[str]) -> int:
    """Prints the per-kind table, then the verdict as one JSON line; exit 1 on any violation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sink-dsn", required=True)
    parser.add_argument("--temporal", required=True, help="the Temporal frontend, host:port")
    parser.add_argument("--log", required=True, help="the campaign's JSON log")
    args = parser.parse_args(argv)
    with open(args.log) as f:
        log = json.load(f)
    with psycopg.connect(args.sink_dsn) as conn:
        rows = conn.execute(ROWS).fetchall()
        ledger = int(conn.execute(LEDGER).fetchone()[0])  # type: ignore[index]
    workflows = list(log["runs"]) + list(log.get("shadows", []))
    temporal = asyncio.run(temporal_states(args.temporal, workflows))
    report = judge(rows, ledger, log, temporal)
    print_verdict(report)
    return int(bool(bad(report)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
