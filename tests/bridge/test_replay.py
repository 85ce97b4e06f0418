"""A recorded DAG-run history replays against today's workflow code without non-determinism.

If this fails, a change to ``bridge/worker/workflows.py`` would break running workflows: guard it
with ``workflow.patched`` instead of re-recording the history.
"""

from __future__ import annotations

import asyncio
import json

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from bridge.worker.lanes import WORKFLOWS
from tests.bridge.record_history import HISTORY


def test_recorded_history_replays_without_nondeterminism() -> None:
    text = HISTORY.read_text()
    events = json.loads(text)["events"]
    kinds = {e["eventType"] for e in events}
    # the recording covers what matters: activities, a durable wait, child workflows
    assert {"EVENT_TYPE_TIMER_STARTED", "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED",
            "EVENT_TYPE_ACTIVITY_TASK_COMPLETED"} <= kinds  # fmt: skip
    # child ids derive from the parent's id: replay under the id it was recorded with
    child = next(
        e["startChildWorkflowExecutionInitiatedEventAttributes"]["workflowId"]
        for e in events
        if e["eventType"] == "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED"
    )
    history = WorkflowHistory.from_json(child.rsplit("/", 2)[0], text)

    async def replay() -> None:
        result = await Replayer(workflows=WORKFLOWS).replay_workflow(history)
        assert result.replay_failure is None, result.replay_failure

    asyncio.run(replay())
