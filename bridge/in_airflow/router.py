"""The bridge's router for the Airflow protected operator (``airflow_plugins.protection.routing``).

Install it with ``[exactly_once] router = bridge.in_airflow.router:BridgeRouter``. Per protected try
it reads the cutover mode of the business run (the DAG and the try's business date), fixed by the
first that asks (a try of any DAG run of that date, a ``BridgeOperator``, a schedule tick:
``ModeStore.fix_for_business_run``). So one business run has one primary engine: a retry, a
cleared task or a second DAG run of the date stays with the engine the business run started in,
even after a rollback (which applies from the next business date on):

* ``airflow``: run here;
* ``shadow``: start the Temporal shadow of this task (not waited for), then run here; a DAG
  shadowed whole (route ``whole``, fixed per business run) gets one shadow per business run instead,
  started from its root task (``bridge.in_airflow.whole_shadow``);
* ``temporal`` / ``temporal-scheduled``: hand the task's work to Temporal (a workflow whose id
  is the task's lease key), defer on ``WorkflowTrigger``, return the workflow's result.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from airflow_plugins.lease import InvalidLeaseInput
from airflow_plugins.lease.keys import split_partition
from airflow_plugins.protection.routing import ProtectedRun, Route
from bridge.config import BridgeConfig, TemporalUnavailable
from bridge.cutover import CutoverMode, mode_store
from bridge.in_airflow import handoff
from bridge.in_airflow.translate import dag_lane, declared_side_effect_free, task_spec
from bridge.spec import DagSpec, RunMode, TaskKind

log = logging.getLogger(__name__)
_running_primary: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "bridge_running_primary", default=False
)


def single_task_spec(operator: Any, context: Mapping[str, Any]) -> DagSpec:
    """The spec of one protected task as it is now (arguments rendered by Airflow).

    Raises:
        InvalidLeaseInput: the task cannot run in Temporal (with the reason).
    """
    dag = context["dag"]
    free = declared_side_effect_free(dag, operator.task_id)
    try:
        spec = task_spec(operator, side_effect_free=free)
    except Exception as exc:  # NotTranslatable, with the reason
        raise InvalidLeaseInput(f"{operator.task_id} cannot run in Temporal: {exc}") from exc
    if spec.kind is TaskKind.EXECUTE and spec.upstream:
        raise InvalidLeaseInput(
            f"{operator.task_id} cannot run in Temporal alone: its operator may pull upstream "
            "XComs, which only a whole-DAG handover (BridgeOperator) carries"
        )
    # Airflow has decided it runs: its upstreams and setups are not the workflow's to decide
    alone = dataclasses.replace(spec, upstream=(), setups=())
    return DagSpec(dag.dag_id, (alone,), lane=dag_lane(dag))


def _fail(message: str) -> BaseException:
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(message)


def _retry(message: str) -> BaseException:
    from airflow.sdk.exceptions import AirflowException

    return AirflowException(message)


class TemporalHandover:
    """Hands one protected task's work to Temporal and waits for it without a worker slot."""

    def start(self, operator: Any, context: Mapping[str, Any], run: ProtectedRun) -> Any:
        """Starts or attaches; returns the recorded result, or defers on the workflow."""
        from bridge.in_airflow.workflow_trigger import WorkflowTrigger

        try:
            spec = single_task_spec(operator, context)
            reply = handoff.request(
                spec,
                split_partition(run.key.business_date)[0],
                part=run.task_id,
                map_key=run.key.map_key,
                source=f"airflow:{run.run_id}:try{run.try_number}",
                partition=handoff.run_partition(context),
                run=handoff.airflow_run(context),
            )
        except TemporalUnavailable as exc:
            raise _retry(f"bridge: {exc}; nothing was started, the next try hands over") from exc
        except InvalidLeaseInput as exc:
            raise _fail(f"bridge: {exc}") from exc
        assert reply is not None
        handoff.record_workflow(context, reply.workflow_id)
        if reply.run_id is None:
            return reply.recorded  # done before: the lease's recorded result
        log.info("bridge: %s %s", "started" if reply.started else "attached to", reply.workflow_id)
        config = BridgeConfig.load()
        operator.defer(
            trigger=WorkflowTrigger(reply.workflow_id, config.temporal_address, config.namespace),
            method_name="resume_handover",
        )

    def resume(
        self, operator: Any, context: Mapping[str, Any], run: ProtectedRun, event: Any
    ) -> Any:
        """The workflow ended: its task's result (XCom), or the task fails with its error."""
        return result_of(event, run.task_id)


def result_of(event: Any, task_id: str | None) -> Any:
    """The result a handed-over run's trigger event carries (for one task, or the whole run).

    Raises:
        AirflowException: the workflow failed or was cancelled (Airflow retries it).
    """
    event = event or {}
    if event.get("status") != "success":
        raise _retry(
            f"bridge: {event.get('workflow_id')} {event.get('status')}: {event.get('error')}"
        )
    result = event["result"]
    if task_id is None:
        return result
    return result["tasks"][task_id]["result"]


class ShadowHandover:
    """Starts the Temporal shadow of a protected task, then runs the task here as primary."""

    def start(self, operator: Any, context: Mapping[str, Any], run: ProtectedRun) -> Any:
        """Fires the shadow (never waited for, never fatal), then the normal protected try.

        The shadow of this task alone, unless its business run's route is ``whole``
        (``whole_shadow.fixed_route``): then one shadow per business run, started from a root
        task (this one, if it is).
        """
        from airflow_plugins.protection import protected_try
        from bridge.in_airflow.whole_shadow import WHOLE, fixed_route, start_for

        try:
            business_date = split_partition(run.key.business_date)[0]
            if fixed_route(context["dag"], business_date) == WHOLE:
                start_for(context["ti"])  # a root task starts it; never fatal either
            else:
                self._shadow_this_task(operator, context, run)
        except Exception as exc:  # the shadow must never disturb the primary
            log.warning("bridge: no shadow for %s: %s", run.key, exc)
        token = _running_primary.set(True)
        try:
            return protected_try.run_try(
                operator,
                context,
                operator.protection(),
                lambda fence: operator.execute_protected(fence, context),
                audit_input=operator.audit_input(),
            )
        finally:
            _running_primary.reset(token)

    @staticmethod
    def _shadow_this_task(operator: Any, context: Mapping[str, Any], run: ProtectedRun) -> None:
        spec = single_task_spec(operator, context)
        handoff.request(
            spec,
            split_partition(run.key.business_date)[0],
            mode=RunMode.SHADOW,
            part=run.task_id,
            map_key=run.key.map_key,
            source=f"airflow:{run.run_id}",
            wait=False,
            partition=handoff.run_partition(context),
            run=handoff.airflow_run(context),
        )

    def resume(
        self, operator: Any, context: Mapping[str, Any], run: ProtectedRun, event: Any
    ) -> Any:
        """Not used: the primary's own deferrals resume through the operator."""
        return operator.execute(context)


class BridgeRouter:
    """Routes protected tries by their DAG run's fixed cutover mode."""

    def route(self, run: ProtectedRun) -> Route:
        """The route of ``run`` (the same for every try of its business run)."""
        if _running_primary.get():
            return Route(CutoverMode.SHADOW.value)
        from airflow_plugins.protection import config

        mode = mode_store(config.lease_store(), config.lease_dsn()).fix_for_business_run(
            run.dag_id, split_partition(run.key.business_date)[0]
        )
        if mode is CutoverMode.AIRFLOW:
            return Route(mode.value)
        if mode is CutoverMode.SHADOW:
            return Route(mode.value, ShadowHandover())
        return Route(mode.value, TemporalHandover())

    def task_started(self, ti: Any) -> None:
        """An unprotected task started (in its task process): the whole-DAG shadow of a DAG
        shadowed whole (ordinary or mixed) in ``shadow`` mode starts from its run's root tasks
        (never fatal)."""
        from bridge.in_airflow.whole_shadow import start_for

        start_for(ti)


router = BridgeRouter()
