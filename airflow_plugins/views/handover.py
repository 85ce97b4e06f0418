"""What the handover page shows: the per-task view of a DAG run's work handed to Temporal.

A handed-over task (a ``BridgeOperator`` driver, or a protected task the router hands over)
records its workflow id in XCom under ``XCOM_KEY`` before it defers, so the page finds, from
the Airflow DAG run alone, the workflows that ran its work. Their Temporal histories are read by
``bridge tasks --json`` in a child process (the bridge's client and codec never load in the
api-server), bounded by ``TIMEOUT_S``: a Temporal that is down or slow gives a page saying so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from typing import Any

log = logging.getLogger(__name__)
XCOM_KEY = "bridge_workflow_id"  # bridge.in_airflow.handoff.XCOM_KEY (no bridge import here)
TIMEOUT_S = 30.0
MAX_WORKFLOWS = 50


@dataclasses.dataclass(frozen=True)
class HandedOver:
    """One Airflow task instance whose work a Temporal workflow ran."""

    task_id: str
    map_index: int
    workflow_id: str


@dataclasses.dataclass(frozen=True)
class HandoverPage:
    """The page's data: the handed-over task instances and, per workflow, its view.

    Attributes:
        handed: the task instances that handed work over, with their workflow ids.
        views: per workflow id, ``bridge tasks``'s answer (``ok``, ``status``, ``tasks`` ...).
        unavailable: why no view could be read (Temporal down, too slow), or None.
    """

    handed: tuple[HandedOver, ...]
    views: dict[str, dict[str, Any]]
    unavailable: str | None = None


def _text(value: Any) -> str:
    if isinstance(value, str) and value.startswith('"'):
        try:
            return str(json.loads(value))
        except json.JSONDecodeError:
            pass
    return str(value)


def handed_over(dag_id: str, run_id: str) -> tuple[HandedOver, ...]:
    """The task instances of the DAG run that recorded a workflow id (Airflow's metadata DB)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(XComModel.task_id, XComModel.map_index, XComModel.value)
            .where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.key == XCOM_KEY,
            )
            .order_by(XComModel.task_id, XComModel.map_index)
            .limit(MAX_WORKFLOWS)
        ).all()
    return tuple(HandedOver(r.task_id, r.map_index, _text(r.value)) for r in rows)


def read_views(workflow_ids: list[str], timeout: float = TIMEOUT_S) -> HandoverPage:
    """Reads each workflow's per-task view through ``bridge tasks --json`` (a child process)."""
    wanted = list(dict.fromkeys(workflow_ids))
    if not wanted:
        return HandoverPage((), {})
    command = [sys.executable, "-m", "bridge.cli", "--json", "tasks", *wanted]
    try:
        done = subprocess.run(
            [*command, "--timeout", str(max(1.0, timeout / 2))],
            capture_output=True,
            timeout=timeout,
            env=dict(os.environ),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return HandoverPage((), {}, f"Temporal did not answer within {timeout:.0f} s")
    views: dict[str, dict[str, Any]] = {}
    for line in done.stdout.decode(errors="replace").splitlines():
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(answer, dict) and answer.get("workflow_id") in wanted:
            views[str(answer["workflow_id"])] = answer
    if views:
        return HandoverPage((), views)
    # the child's message may name hosts or settings: the operator's log has it, not the page
    log.error("bridge tasks failed (exit %s): %s", done.returncode, done.stderr.decode()[-2000:])
    reason = "Temporal is unreachable" if done.returncode == 3 else "the bridge could not read it"
    return HandoverPage((), {}, f"{reason} (exit {done.returncode}; details in the log)")


def handover_page(dag_id: str, run_id: str) -> HandoverPage:
    """The page of one DAG run: what it handed over and what each of those tasks did."""
    handed = handed_over(dag_id, run_id)
    read = read_views([h.workflow_id for h in handed])
    return dataclasses.replace(read, handed=handed)
