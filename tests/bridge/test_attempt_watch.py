"""What the heartbeat thread asks the real Temporal dev server about a running attempt: the one
Temporal waits for is wanted; another attempt number, or an attempt of a closed workflow, is not."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
from datetime import date, timedelta
from types import SimpleNamespace
from typing import Any

from temporalio import activity
from temporalio.service import RPCError, RPCStatusCode

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


class _RefusingClient:
    """A server that answers every describe with ``status`` (the RPC is the boundary)."""

    def __init__(self, status: RPCStatusCode) -> None:
        self.status = status
        self.asked = 0

    def get_workflow_handle(self, workflow_id: str, run_id: str | None = None) -> Any:
        client = self

        class Handle:
            async def describe(self) -> Any:
                client.asked += 1
                raise RPCError("no", client.status, b"")

        return Handle()


def _ask_twice(status: RPCStatusCode) -> tuple[list[Attempt], int]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        client = _RefusingClient(status)
        watch = TemporalAttemptWatch(client, loop)
        info = SimpleNamespace(workflow_id="w", workflow_run_id="r", activity_id="1", attempt=1)
        answers = [watch.ask(info), watch.ask(info)]
        return answers, client.asked
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_a_server_out_of_reach_is_unknown_and_asked_again() -> None:
    answers, asked = _ask_twice(RPCStatusCode.UNAVAILABLE)
    assert answers == [Attempt.UNKNOWN, Attempt.UNKNOWN]
    assert asked == 2


def test_a_server_that_refuses_to_describe_never_stops_the_work() -> None:
    answers, asked = _ask_twice(RPCStatusCode.PERMISSION_DENIED)
    assert answers == [Attempt.WANTED, Attempt.WANTED]
    assert asked == 1  # switched off after the first refusal


def test_a_closed_loop_is_unknown_not_an_error() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    watch = TemporalAttemptWatch(_RefusingClient(RPCStatusCode.UNAVAILABLE), loop)
    info = SimpleNamespace(workflow_id="w", workflow_run_id="r", activity_id="1", attempt=1)
    assert watch.ask(info) is Attempt.UNKNOWN
