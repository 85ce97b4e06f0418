"""The handover: one Temporal workflow execution per business run, or the one already there.

The workflow id is derived from the run's lease key, and the start asks Temporal to use the
existing execution when one is running, so a second handover of the same business run (another
try, another DAG run, another scheduler) attaches instead of starting a second execution. A
closed successful run is attached to as well; a failed one may be started again (that is a
retry: its tasks' leases skip what already succeeded). Once Temporal no longer retains the run,
the run key's lease in the lease store is what says it is done.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from airflow_plugins.lease import InvalidLeaseInput, LeaseStore
from airflow_plugins.lease.keys import lease_key
from bridge.config import TemporalUnavailable
from bridge.graph import graph_problems, shadow_refusals
from bridge.identity import run_key, workflow_id
from bridge.partition import check_partition, keyed_date
from bridge.spec import AirflowRun, DagRunInput, DagRunResult, DagSpec, Handoff, RunMode
from bridge.worker.workflows import DagRunWorkflow

DEFAULT_MAX_PAYLOAD = 2_000_000


class PayloadTooLarge(InvalidLeaseInput):
    """The run's input is over Temporal's payload limit: nothing was started."""


class HandoverRefused(InvalidLeaseInput):
    """The DAG cannot be handed over as it is (untranslatable, unsafe for shadow)."""


class Handover:
    """Hands business runs to Temporal.

    Args:
        client: a connected Temporal client (with the bridge's codec).
        task_queue: the task queue of the DAG's lane.
        store: the lease store, to find runs that are done but no longer retained by Temporal.
        max_payload_bytes: refuse inputs larger than this (Temporal refuses over 2 MiB).
    """

    def __init__(
        self,
        client: Client,
        task_queue: str,
        *,
        store: LeaseStore | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.store = store
        self.max_payload_bytes = max_payload_bytes

    async def start_or_attach(
        self,
        spec: DagSpec,
        business_date: str,
        *,
        mode: RunMode = RunMode.PRIMARY,
        source: str = "",
        compare_poll_s: float = 30.0,
        part: str | None = None,
        map_key: str | None = None,
        fanout_threshold: int = 200,
        partition_key: str | None = None,
        partition_date: str | None = None,
        airflow_run: AirflowRun | None = None,
    ) -> Handoff:
        """Starts the business run's workflow, or attaches to the execution that has its id.

        ``part`` hands over one task of the run (an Airflow protected task routed to Temporal):
        the workflow id is then derived from that task's lease key (and ``map_key``'s item).
        ``partition_key`` (with its ``partition_date`` as Airflow resolved it:
        ``bridge.partition.resolve``) hands over one asset partition of the business date: a
        run of its own, whose ids and keys name it. ``airflow_run`` is the Airflow run handed
        over (its type, conf and data interval: its tasks' ``dag_run``); a second handover of
        the same business run attaches to the first's execution, with the first's.

        Raises:
            HandoverRefused: the graph is broken, or has tasks unsafe for shadow.
            PayloadTooLarge: the input is over the payload limit.
            TemporalUnavailable: Temporal did not answer; nothing was started.
            InvalidLeaseInput: bad DAG id, business date or partition key.
        """
        check_partition(spec, partition_key)
        wid = workflow_id(
            spec.dag_id,
            business_date,
            mode,
            part=part,
            map_key=map_key,
            partition_key=partition_key,
        )
        problems = graph_problems(spec) + (shadow_refusals(spec) if mode is RunMode.SHADOW else [])
        if problems:
            raise HandoverRefused(f"{spec.dag_id} cannot be handed over: " + "; ".join(problems))
        if mode is RunMode.PRIMARY and self.store is not None:
            done_key = (
                lease_key(spec.dag_id, part, keyed_date(business_date, partition_key), map_key)
                if part
                else run_key(spec.dag_id, business_date, partition_key)
            )
            # off the event loop: concurrent handovers must not queue behind one query
            row = await asyncio.to_thread(self.store.get, str(done_key))
            if row is not None and row["state"] == "succeeded":
                return Handoff(wid, None, started=False, recorded=row["result"])
        inp = DagRunInput(
            spec,
            business_date,
            mode,
            source,
            compare_poll_s=compare_poll_s,
            map_key=map_key,
            fanout_threshold=fanout_threshold,
            chunk_size=max(1, min(500, fanout_threshold)),
            partition_key=partition_key,
            partition_date=partition_date,
            airflow_run=airflow_run,
        )
        await self._check_size(inp)
        try:
            handle = await self.client.start_workflow(
                DagRunWorkflow.run,
                inp,
                id=wid,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )
        except WorkflowAlreadyStartedError as exc:
            # closed and succeeded: that execution is the business run; attach to it
            return Handoff(wid, exc.run_id, started=False)
        except RPCError as exc:
            if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
                raise TemporalUnavailable(f"Temporal did not take {wid}: {exc}") from exc
            raise
        return Handoff(wid, handle.result_run_id, started=_started(handle))

    async def _check_size(self, inp: DagRunInput) -> None:
        payloads = await self.client.data_converter.encode([inp])
        size = sum(p.ByteSize() for p in payloads)
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"{inp.spec.dag_id} {inp.business_date}: the run's input is {size} bytes, over "
                f"the {self.max_payload_bytes}-byte limit; pass references (table names, object "
                "keys), not data, in task arguments"
            )


def _started(handle: WorkflowHandle[Any, Any]) -> bool:
    # USE_EXISTING answers with started=false when it attached to the running execution
    response = getattr(handle, "_start_workflow_response", None)
    return bool(getattr(response, "started", True))


async def cancel(client: Client, workflow_id: str) -> None:
    """Cancels a handed-over run (a user's clear or mark-failed); a closed run is left alone."""
    try:
        await client.get_workflow_handle(workflow_id).cancel()
    except RPCError as exc:
        if exc.status is not RPCStatusCode.NOT_FOUND:
            raise


def run_handle(client: Client, workflow_id: str) -> WorkflowHandle[Any, DagRunResult]:
    """A typed handle on a handed-over business run (its result is a ``DagRunResult``)."""
    return client.get_workflow_handle_for(DagRunWorkflow.run, workflow_id)
