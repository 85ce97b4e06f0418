"""The trigger a handed-over Airflow task waits on: the Temporal workflow's result.

It holds no worker slot (it runs in the triggerer). If the triggerer restarts, the trigger is
recreated and attaches again: the workflow goes on in Temporal regardless. Only a user's action
on the deferred task (mark failed, clear, mark success) calls ``on_kill``, which cancels the
workflow; a triggerer restart or a redistribution does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from bridge.config import BridgeConfig, TemporalUnavailable

RECONNECT_S = 5.0


class WorkflowTrigger(BaseTrigger):
    """Waits for a workflow's result.

    Args:
        workflow_id: the handed-over run's workflow id.
        temporal_address: the Temporal frontend.
        namespace: the Temporal namespace.
    """

    def __init__(self, workflow_id: str, temporal_address: str, namespace: str = "default") -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.workflow_id = workflow_id
        self.temporal_address = temporal_address
        self.namespace = namespace

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The exact classpath and arguments."""
        return (
            "bridge.in_airflow.workflow_trigger.WorkflowTrigger",
            {
                "workflow_id": self.workflow_id,
                "temporal_address": self.temporal_address,
                "namespace": self.namespace,
            },
        )

    def _config(self) -> BridgeConfig:
        return BridgeConfig(temporal_address=self.temporal_address, namespace=self.namespace)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yields one event: success with the result, failed with the error, or cancelled."""
        # Temporal is loaded here, in the triggerer, never in the task process that defers
        from temporalio.client import WorkflowFailureError
        from temporalio.exceptions import CancelledError as TemporalCancelled
        from temporalio.service import RPCError

        from bridge.temporal.client import connect

        while True:
            try:
                client = await connect(self._config())
                result = await client.get_workflow_handle(self.workflow_id).result()
            except (TemporalUnavailable, RPCError) as exc:
                self.log.warning("waiting for %s: %s; retrying", self.workflow_id, exc)
                await asyncio.sleep(RECONNECT_S)
                continue
            except WorkflowFailureError as exc:
                cause = exc.cause
                status = "cancelled" if isinstance(cause, TemporalCancelled) else "failed"
                yield TriggerEvent(  # type: ignore[no-untyped-call]
                    {"status": status, "workflow_id": self.workflow_id, "error": str(cause or exc)}
                )
                return
            yield TriggerEvent(  # type: ignore[no-untyped-call]
                {"status": "success", "workflow_id": self.workflow_id, "result": result}
            )
            return

    async def on_kill(self) -> None:
        """A user acted on the deferred task: cancel the workflow (a closed one is left)."""
        from bridge.temporal.client import connect
        from bridge.temporal.handover import cancel

        self.log.info("user action on the deferred task: cancelling %s", self.workflow_id)
        await cancel(await connect(self._config()), self.workflow_id)
