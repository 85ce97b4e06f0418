"""Per-task comparison of a whole-DAG shadow: each task as Airflow ran it against Temporal.

An ordinary DAG (no protected task, no ``BridgeOperator``) has no lease rows nor sink ledger
for the comparison to read; its Airflow side is what Airflow's REST API reports for the DAG run
(``bridge.airflow_side``): per task its state, duration and every XCom (digested). The shadow's
side is the Temporal workflow's result. A task differs when its state differs (success, failed,
skipped, upstream_failed: a branch or a trigger rule decided otherwise) or an XCom's digest
differs; durations are kept side by side in the row, never a difference (two engines never
take the same time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from bridge.spec import DagRunResult

#: Temporal's task statuses in Airflow's words.
_STATE = {"succeeded": "success"}


@dataclasses.dataclass(frozen=True)
class TaskSide:
    """One task of one engine's run: its state, duration and XCom digests (key -> digest)."""

    state: str
    ms: int | None
    xcoms: dict[str, str]

    def as_row(self) -> dict[str, Any]:
        """What ``bridge.comparison`` stores for it."""
        return {"state": self.state, "ms": self.ms, "xcoms": self.xcoms}


def shadow_tasks(shadow: DagRunResult) -> dict[str, TaskSide]:
    """The shadow's side: each task's state, duration and XCom digests (``return_value`` and
    every other key it pushed)."""
    from bridge.comparison import digest

    sides: dict[str, TaskSide] = {}
    for task_id, outcome in shadow.tasks.items():
        state = _STATE.get(outcome.status, outcome.status)
        xcoms: dict[str, str] = {}
        if state == "success":
            if outcome.result is not None:
                xcoms["return_value"] = digest(outcome.result)
            xcoms.update({k: digest(v) for k, v in outcome.xcoms.items()})
        sides[task_id] = TaskSide(state, outcome.duration_ms or None, xcoms)
    return sides


def run_state(tasks: dict[str, TaskSide], decisive: Collection[str] | None = None) -> str:
    """A run's status from its tasks (for the row's ``*_status``).

    Args:
        tasks: every task of the run.
        decisive: the tasks whose states decide the run's once all are done
            (``bridge.graph.run_state_tasks``: teardowns left out, as Airflow); None: all.
    """
    states = {t.state for t in tasks.values()}
    if not tasks or states & {"running", "queued", "scheduled", "none", "deferred"}:
        return "running"
    counted = {t.state for i, t in tasks.items() if decisive is None or i in decisive}
    return "failed" if counted & {"failed", "upstream_failed"} else "success"


def differences(airflow: dict[str, TaskSide], shadow: dict[str, TaskSide]) -> list[dict[str, Any]]:
    """Where the two sides differ, task by task: ``state`` and ``xcom`` differences."""
    found: list[dict[str, Any]] = []
    for task_id in sorted(set(airflow) | set(shadow)):
        a, s = airflow.get(task_id), shadow.get(task_id)
        a_state = a.state if a else "missing"
        s_state = s.state if s else "missing"
        if a_state != s_state:
            found.append({"what": "state", "task": task_id, "primary": a_state, "shadow": s_state})
            continue
        a_x, s_x = (a.xcoms if a else {}), (s.xcoms if s else {})
        for key in sorted(set(a_x) | set(s_x)):
            if a_x.get(key) != s_x.get(key):
                found.append(
                    {
                        "what": "xcom",
                        "task": task_id,
                        "key": key,
                        "primary": a_x.get(key),
                        "shadow": s_x.get(key),
                    }
                )
    return found
