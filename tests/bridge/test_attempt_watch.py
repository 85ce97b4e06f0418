"""What the heartbeat thread asks the real Temporal dev server about a running attempt: the one
Temporal waits for is wanted; another attempt number, or an attempt of a closed workflow, is not."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import date, timedelta
from typing import Any

from temporalio import activity

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.spec import DagSpec, TaskSpec
from bridge.temporal.handover import Handover, run_handle
from bridge.worker.attempt_watch import Attempt, TemporalAttemptWatch
from tests.bridge.conftest import running_worker

BD = (date.today() - timedelta(days=1)).isoformat()
SEEN: dict[str, Any] = {}


def probe() -> str:
    """A task that asks, from its own activity thread, what Temporal says of it."""
    info = activity.info()
    watch: TemporalAttemptWatch = SEEN["watch"]
    SEEN["info"] = info
    SEEN["this attempt"] = watch.ask(info)
    SEEN["a later attempt"] = watch.ask(dataclasses.replace(info, attempt=info.attempt + 1))
    return "asked"


def test_the_watch_tells_the_attempt_temporal_waits_for_from_any_other(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    spec = DagSpec(
        dag_id=f"watch_{uuid.uuid4().hex[:8]}",
        tasks=(TaskSpec("probe", callable_ref=f"{__name__}:probe", side_effect_free=True),),
    )

    async def scenario() -> Any:
        async with running_worker(config, lease_store) as client:
            SEEN["watch"] = TemporalAttemptWatch(client, asyncio.get_running_loop())
            handover = Handover(client, config.task_queue("default"), store=lease_store)
            got = await handover.start_or_attach(spec, BD)
            result = await run_handle(client, got.workflow_id).result()
            # the workflow is closed: no attempt of it is wanted any more
            closed = await asyncio.to_thread(SEEN["watch"].ask, SEEN["info"])
            return result, closed

    result, closed = asyncio.run(scenario())
    assert result.status == "success"
    assert SEEN["this attempt"] is Attempt.WANTED
    assert SEEN["a later attempt"] is Attempt.GIVEN_UP
    assert closed is Attempt.GIVEN_UP
