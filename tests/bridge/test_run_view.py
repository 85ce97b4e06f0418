"""A handed-over run's per-task view, read from its Temporal history (what Airflow's page shows).

On the real dev server and worker: a run whose first task succeeds and second fails after its
attempts shows each task's state, attempts, start/end and the failure's message with the secret
in it masked; a task never reached is absent. ``bridge tasks`` prints the same as JSON (what the
plugin's page reads in a child process), and says so clearly when Temporal is down.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from temporalio.client import WorkflowFailureError

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.spec import DagSpec, RetrySpec, TaskSpec
from bridge.temporal.handover import Handover, run_handle
from bridge.temporal.run_view import read_run_view
from tests.bridge.conftest import REPO, running_worker
from tests.bridge.test_dag_run import BD, new_dag

SECRET = "hunter2-not-for-pages"


def _tasks(config: BridgeConfig, *wids: str, addr: str = "") -> subprocess.CompletedProcess[str]:
    env = {"BRIDGE_TEMPORAL_ADDR": addr or config.temporal_address, "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", "--json", "tasks", *wids, "--timeout", "5"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_each_task_of_a_handed_over_run_shows_its_state_attempts_and_masked_failure(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    spec = DagSpec(
        dag_id=new_dag(),
        tasks=(
            TaskSpec("extract", callable_ref="builtins:len", args=([1, 2],), side_effect_free=True),
            TaskSpec("load", upstream=("extract",), callable_ref="builtins:int",
                     args=(f"password={SECRET}",), side_effect_free=True,
                     retry=RetrySpec(initial_interval_s=0.1, maximum_interval_s=0.2,
                                     maximum_attempts=3)),
            TaskSpec("report", upstream=("load",), callable_ref="builtins:len", args=([],)),
        ),
    )  # fmt: skip

    async def scenario() -> str:
        async with running_worker(config, lease_store) as client:
            got = await Handover(client, config.task_queue("default")).start_or_attach(spec, BD)
            with pytest.raises(WorkflowFailureError):
                await run_handle(client, got.workflow_id).result()
            view = await read_run_view(client, got.workflow_id)
            assert view.status == "failed"
            rows = {t.task_id: t for t in view.tasks}
            assert list(rows) == ["extract", "load"]  # report was never reached
            assert (rows["extract"].state, rows["extract"].attempts) == ("succeeded", 1)
            assert (rows["load"].state, rows["load"].attempts) == ("failed", 3)
            failure = rows["load"].failure or ""
            assert "invalid literal for int()" in failure
            assert "password=***" in failure
            for row in rows.values():
                assert row.started is not None
                assert row.ended is not None
                assert row.started <= row.ended
                assert row.duration_ms is not None
            return got.workflow_id

    wid = asyncio.run(scenario())
    done = _tasks(config, wid, "dagrun:no_such_dag/dagrun/2024-02-15")
    assert done.returncode == 1, done.stderr
    found, missing = (json.loads(line) for line in done.stdout.splitlines())
    assert [(t["task_id"], t["state"]) for t in found["tasks"]] == [
        ("extract", "succeeded"),
        ("load", "failed"),
    ]
    assert missing == {
        "ok": False,
        "workflow_id": "dagrun:no_such_dag/dagrun/2024-02-15",
        "error": "no such workflow",
    }
    assert SECRET not in done.stdout + done.stderr
    # Temporal down: a clear answer, exit 3, nothing else
    down = _tasks(config, wid, addr="127.0.0.1:9")
    assert down.returncode == 3, down.stderr
    assert down.stdout == ""
    assert "Temporal at 127.0.0.1:9 is unreachable" in down.stderr
