"""``BridgeOperator``: hands a whole DAG run (or a set of its tasks) to Temporal.

    BridgeOperator(task_id="run_in_temporal", source_dag=billing_graph)

One workflow execution per business run: its id is derived from the run's lease key
(``dagrun:billing_nightly/dagrun/2024-02-15``), so a second handover (another try, another DAG
run of the same date) attaches instead of starting another. The operator waits deferred (no
worker slot), pushes the workflow's result to XCom and fails with the workflow's error. A try
that dies only detaches: the workflow goes on and the next try re-attaches. Only a user's action
on the deferred task (clear, mark failed) cancels the workflow (``WorkflowTrigger.on_kill``).

It obeys the graph's cutover mode (``bridge mode set GRAPH ...``), fixed per business run by the
first try that asks (``ModeStore.fix_for_business_run``: a retry, a clear or a second driver run
of the same date keeps it, so a mode change mid-run never makes both engines primaries of one
business run):

* ``airflow``: nothing is handed over; the task is skipped (the graph's tasks run in Airflow);
* ``shadow``: Airflow is primary; the Temporal shadow of the run is started (never waited for,
  never fatal) and the task is skipped;
* ``temporal`` / ``temporal-scheduled``: Temporal is primary: hand over (or attach) and wait.

Per-task handover of protected tasks (cutover modes) goes through ``bridge.in_airflow.router``
instead.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from airflow.sdk import BaseOperator

from airflow_plugins.lease import InvalidLeaseInput
from airflow_plugins.protection.task_identity import target_from_context
from bridge.config import BridgeConfig, TemporalUnavailable
from bridge.cutover import CutoverMode, mode_store
from bridge.in_airflow import handoff
from bridge.in_airflow.router import result_of
from bridge.in_airflow.translate import UntranslatableDag, translate
from bridge.spec import DagSpec, RunMode

log = logging.getLogger(__name__)


def fixed_mode(dag_id: str, business_date: str) -> CutoverMode:
    """The cutover mode of one business run of ``dag_id`` (fixed by the first caller), read
    from the lease store the handover uses."""
    from airflow_plugins.lease import LeaseStore

    dsn = handoff.resolved_config().lease_dsn
    if not dsn:
        raise InvalidLeaseInput("no lease store: set BRIDGE_LEASE_DSN")
    with LeaseStore(dsn) as store:
        return mode_store(store, dsn).fix_for_business_run(dag_id, business_date)


class BridgeOperator(BaseOperator):
    """Runs a DAG's task graph as one Temporal workflow execution per business run.

    Args:
        source_dag: the DAG object whose tasks run in Temporal (a DAG defined beside the
            driver, never scheduled by Airflow itself).
        source_dag_id: or its id, found in ``BRIDGE_DAGS_FOLDER``.
        task_ids: only these tasks of it (default: all but this one).
        period: the business period (default: the DAG's).
    """

    ui_color = "#e8e0f8"

    def __init__(
        self,
        *,
        source_dag: Any = None,
        source_dag_id: str | None = None,
        task_ids: Collection[str] | None = None,
        period: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retries", 4)
        super().__init__(**kwargs)
        self.source_dag = source_dag
        self.source_dag_id = source_dag_id
        self.task_ids = list(task_ids) if task_ids is not None else None
        self.period = period

    def _source(self, context: Mapping[str, Any]) -> Any:
        if self.source_dag is not None:
            return self.source_dag
        own = context["dag"]
        if not self.source_dag_id or self.source_dag_id == own.dag_id:
            return own
        from airflow.dag_processing.dagbag import DagBag

        folder = BridgeConfig.load().dags_folder
        dag = DagBag(folder, safe_mode=False).dags.get(self.source_dag_id)
        if dag is None:
            raise InvalidLeaseInput(f"DAG {self.source_dag_id!r} is not in the DAG folder")
        return dag

    def _spec(self, context: Mapping[str, Any]) -> DagSpec:
        dag = self._source(context)
        wanted = [
            t
            for t in dag.task_ids
            if t != self.task_id and (self.task_ids is None or t in self.task_ids)
        ]
        if len(wanted) != len(dag.task_ids):
            dag = dag.partial_subset(wanted, include_upstream=False, include_downstream=False)
        translation = translate(
            dag,
            render=lambda value, _: self.render_template(value, context),  # type: ignore[arg-type]
        )
        if translation.spec is None:
            raise UntranslatableDag(translation)
        return translation.spec

    def execute(self, context: Any) -> Any:
        """Hands the run over (or attaches) and defers until the workflow ends."""
        from airflow.sdk.exceptions import (
            AirflowException,
            AirflowFailException,
            AirflowSkipException,
        )

        from bridge.in_airflow.workflow_trigger import WorkflowTrigger

        part = None if self.task_ids is None else self.task_id
        try:
            spec = self._spec(context)
            business_date = target_from_context(context, period=self.period).business_date
            partition = handoff.run_partition(context)  # a bad key fails here, before a start
            mode = fixed_mode(spec.dag_id, business_date)
            if mode is CutoverMode.SHADOW:
                self._start_shadow(spec, business_date, part, context, partition)
            if not mode.temporal_primary:
                raise AirflowSkipException(
                    f"bridge: {spec.dag_id} {business_date} is fixed to mode {mode.value}: "
                    "Airflow is primary, nothing handed over"
                )
            reply = handoff.request(
                spec,
                business_date,
                part=part,
                source=f"airflow:{context['run_id']}",
                partition=partition,
                run=handoff.airflow_run(context),
            )
        except TemporalUnavailable as exc:
            raise AirflowException(f"bridge: {exc}; nothing was started") from exc
        except (InvalidLeaseInput, UntranslatableDag) as exc:
            raise AirflowFailException(f"bridge: {exc}") from exc
        assert reply is not None
        handoff.record_workflow(context, reply.workflow_id)
        if reply.run_id is None:
            return reply.recorded
        config = BridgeConfig.load()
        self.defer(
            trigger=WorkflowTrigger(reply.workflow_id, config.temporal_address, config.namespace),
            method_name="execute_complete",
        )

    def _start_shadow(
        self,
        spec: DagSpec,
        business_date: str,
        part: str | None,
        context: Any,
        partition: tuple[str, str | None] | None = None,
    ) -> None:
        """Starts the run's Temporal shadow; never waited for, never fatal to Airflow's run."""
        try:
            handoff.request(
                spec,
                business_date,
                mode=RunMode.SHADOW,
                part=part,
                source=f"airflow:{context['run_id']}",
                wait=False,
                partition=partition,
                run=handoff.airflow_run(context),
            )
        except Exception as exc:  # the shadow must never disturb the primary
            log.warning("bridge: no shadow for %s %s: %s", spec.dag_id, business_date, exc)

    def execute_complete(self, context: Any, event: Any = None) -> Any:
        """The workflow ended: its result goes to XCom, or the task fails with its error."""
        return result_of(event, None)
