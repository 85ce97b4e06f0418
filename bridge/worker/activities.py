"""The bridge's activities: one task of a business run under its lease and sink fence.

An activity takes the lease of its task's key (the key the Airflow operator builds), raises the
sink's fence to its token, runs the task's code with a fence, and completes the lease with the
result. Held by another live holder, it returns ``held`` at once: the workflow waits on a
durable timer and calls again, so waiting holds no worker slot and uses up no attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from airflow_plugins.lease import Holder, Lease, LeaseKeeper, LeaseStore, Outcome
from airflow_plugins.lease.errors import (
    InvalidLeaseInput,
    LeaseLost,
    LeaseStoreUnavailable,
    StaleToken,
)
from airflow_plugins.lease.fence import Fence, FenceStopped
from airflow_plugins.lease.keys import first_day
from airflow_plugins.lease.run import ResultNotRecorded, run_under_lease
from airflow_plugins.protection.task_state_store import installed as installed_task_state
from bridge.comparison import CompareInput, Comparison, compare_run, record_primary
from bridge.cutover import ModeStore
from bridge.graph import substitute
from bridge.identity import run_key, task_lease_key
from bridge.spec import (
    DagRunResult,
    PokeInput,
    PokeResult,
    RunMode,
    TaskInput,
    TaskKind,
    TaskResult,
)
from bridge.worker import shadow_record, xcom_record
from bridge.worker.activity_fence import BridgeFence, sink_dsn
from bridge.worker.asset_state import CONTEXT_KEY as ASSET_STATE
from bridge.worker.asset_state import asset_state_stores
from bridge.worker.attempt_watch import Attempt, AttemptWatch
from bridge.worker.catalog import TaskCatalog, TaskCodeNotFound
from bridge.worker.egress import ShadowEgressRefused, allowed_addresses, no_egress
from bridge.worker.execution import business_run, run_operator, template_context
from bridge.worker.sensing import poke_once

#: Error types the workflow's retry policy never retries: retrying cannot fix them.
NON_RETRYABLE = ("TaskCodeNotFound", "InvalidInput", "LeaseRefused")
#: An operator's exceptions that fail its task at once (Airflow does not retry them either;
#: a deferral that slipped past the translatability check cannot be resumed in a worker).
_FAIL_NOW = {
    "AirflowFailException",
    "ParamValidationError",
    "TaskDeferred",
    "XComNotCarried",
}
MAX_WAIT_S = 30.0
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
UNAVAILABLE_WAIT_S = 5.0
#: How long an activity whose work returned retries recording it while the store is away.
COMPLETE_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class FixedModeInput:
    """Asks for the cutover mode of one run (fixed by the first who asks)."""

    dag_id: str
    run_id: str


class BridgeActivities:
    """The activities of one worker, bound to its lease store, mode store and task catalog.

    Args:
        store: the lease store (the same one Airflow's operator uses).
        catalog: where the worker finds task code.
        modes: the cutover mode store (for scheduled runs and comparisons).
        watch: asks Temporal whether it still wants a running attempt (the worker's client);
            None: only a cancellation the SDK delivers gives a lease up.
    """

    def __init__(
        self,
        store: LeaseStore,
        catalog: TaskCatalog,
        modes: ModeStore,
        watch: AttemptWatch | None = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.modes = modes
        self.watch = watch

    @activity.defn(name="bridge.run_task")
    def run_task(self, inp: TaskInput) -> TaskResult:
        """Runs one task (or one mapped item) of a business run under its lease."""
        info = activity.info()
        spec = inp.task
        key = task_lease_key(
            inp.dag_id, spec.task_id, inp.business_date, inp.map_key, inp.mode, inp.partition_key
        )
        holder = Holder.temporal(
            workflow_id=info.workflow_id or "",
            workflow_run_id=info.workflow_run_id or "",
            activity_id=info.activity_id,
            attempt=info.attempt,
        )
        try:
            sink = sink_dsn(spec.sink) if spec.sink else None
        except InvalidLeaseInput as exc:
            raise ApplicationError(str(exc), type="InvalidInput", non_retryable=True) from exc
        try:
            got = self.store.acquire(
                key,
                holder,
                ttl=spec.lease_ttl_s,
                business_date=first_day(inp.business_date),
                input={"map_value": inp.map_value} if spec.mapped else None,
            )
        except LeaseStoreUnavailable as exc:
            activity.logger.warning("lease store unavailable for %s: %s", key, exc)
            return TaskResult("unavailable", key, wait_s=UNAVAILABLE_WAIT_S, holder=str(exc))
        except InvalidLeaseInput as exc:
            raise ApplicationError(str(exc), type="InvalidInput", non_retryable=True) from exc
        if got.outcome is Outcome.SUCCEEDED:
            if inp.mode is RunMode.SHADOW:  # a retry: what the first attempt captured
                result, captured = shadow_record.decode(got.result)
                return TaskResult(
                    "recorded", key, result=result, token=got.token, captured=captured
                )
            result, pushed = xcom_record.decode(got.result)
            skipped, skip = xcom_record.skips(pushed)
            return TaskResult(
                "skipped" if skipped else "recorded",
                key,
                result=result,
                token=got.token,
                xcoms=xcom_record.xcoms_of(spec, result, pushed),
                skip=skip,
            )
        if got.outcome is Outcome.HELD:
            return TaskResult("held", key, wait_s=_wait(got.expires_at), holder=_who(got.holder))
        if got.outcome is Outcome.REFUSED:
            raise ApplicationError(f"{key}: {got.detail}", type="LeaseRefused", non_retryable=True)
        return self._run_held(inp, got.lease, sink)

    def _run_held(self, inp: TaskInput, lease: Lease, sink: str | None) -> TaskResult:
        spec = inp.task
        fence = BridgeFence(
            lease=lease,
            business_date=inp.business_date,
            sink=sink,
            shadow=inp.mode is RunMode.SHADOW,
        )

        pushed: dict[str, Any] = {}  # XComs other than the return value (ti.xcom_push)

        def call(fence: BridgeFence) -> Any:
            try:
                return self._call(inp, fence, pushed)
            except Exception as exc:  # a skip is an outcome, not a failure (as in Airflow)
                if not xcom_record.note_skip(exc, pushed):
                    raise
                return None

        def body(fence: Fence) -> Any:
            assert isinstance(fence, BridgeFence)
            if fence.shadow and not spec.side_effect_free:
                with no_egress(allowed_addresses(sink)):  # it must not reach the world
                    return call(fence)
            return call(fence)

        capture: dict[str, Any] = {}  # a shadow's, once its work returned

        def record(result: Any) -> Any:
            if not fence.shadow:
                # kept with the lease, so a retry that finds it succeeded hands them on too
                return xcom_record.encode(result, pushed)
            # kept with the shadow lease, so a retry that finds it succeeded compares the same
            capture.update(shadow_record.captured(fence))
            return shadow_record.encode(result, capture, max_bytes=self.store.max_result_bytes)

        started = time.monotonic()
        try:
            # the heartbeat beats on while the result is recorded
            with _Heartbeat(spec.heartbeat_s, fence, self.watch) as beat:
                result = run_under_lease(
                    self.store,
                    fence,
                    body,
                    complete_timeout=COMPLETE_TIMEOUT_S,
                    encode=record,
                    while_running=beat.watching,
                )
        except ResultNotRecorded as exc:
            if exc.final:
                raise ApplicationError(str(exc), type="InvalidInput", non_retryable=True) from exc
            raise ApplicationError(str(exc), type=type(exc.__cause__).__name__) from exc
        except BaseException as exc:
            raise _as_application_error(exc) from exc
        skipped, skip = xcom_record.skips(pushed)
        return TaskResult(
            "skipped" if skipped else "succeeded",
            lease.key,
            result=result,
            token=lease.token,
            duration_ms=round((time.monotonic() - started) * 1000),
            captured=capture,
            xcoms=xcom_record.xcoms_of(spec, result, pushed),
            skip=skip,
        )

    def _call(self, inp: TaskInput, fence: BridgeFence, pushed: dict[str, Any]) -> Any:
        spec = inp.task
        if spec.kind is TaskKind.NOOP:
            return None
        if spec.kind is TaskKind.EXECUTE:
            return self._execute(inp, fence, pushed)
        fn = self.catalog.resolve(inp.dag_id, spec)
        args = substitute(list(spec.args), inp.upstream)
        kwargs = substitute(dict(spec.kwargs), inp.upstream)
        if spec.map_over is not None:
            kwargs[spec.map_arg] = inp.map_value
        elif spec.expand or spec.expand_kwargs is not None:  # the item's arguments, by name
            kwargs.update(inp.map_value)
        if not spec.fenced:
            with self._item_context(inp, fence, kwargs):
                result = fn(*args, **kwargs)
                if inspect.iscoroutine(result):  # an async (mapped) callable: run to completion
                    return asyncio.run(result)
                return result
        # as the Airflow operator calls it: the fence first when it is the first parameter
        params = list(inspect.signature(fn).parameters.values())
        if params and params[0].name == "fence" and params[0].kind in _POSITIONAL:
            return fn(fence, *args, **kwargs)
        return fn(*args, fence=fence, **kwargs)

    @contextlib.contextmanager
    def _item_context(self, inp: TaskInput, fence: Fence, kwargs: dict[str, Any]) -> Iterator[None]:
        """The context arguments a mapped callable takes (``spec.context_args``) in ``kwargs``,
        from the worker's context for this item (its ``ti.map_index``, the lease's task state
        for the item); one the context lacks keeps its default, as in Airflow."""
        if not inp.task.context_args:
            yield
            return
        task, context = self._operator_context(inp)
        context["ti"].map_index = inp.map_index
        with installed_task_state(task, context, fence):
            kwargs.update({n: context[n] for n in inp.task.context_args if n in context})
            yield

    def _execute(self, inp: TaskInput, fence: Fence, pushed: dict[str, Any]) -> Any:
        """Runs an operator's ``execute`` rebuilt from the worker's DAG folder, with the lease's
        task state as its ``task_state_store`` (a durable operator's job is submitted once per
        business key, as in Airflow: ``airflow_plugins.protection.task_state_store``) and the
        bridge's asset state as its ``asset_state_store`` (``bridge.worker.asset_state``)."""
        task, context = self._operator_context(inp)
        try:
            with installed_task_state(task, context, fence):
                return run_operator(task, context)
        finally:
            pushed.update(context["ti"].pushed)

    def _operator_context(self, inp: TaskInput) -> tuple[Any, dict[str, Any]]:
        """The operator rebuilt from the DAG folder, and the context its ``execute`` reads, with
        its asset state store when it has a concrete asset (as Airflow)."""
        from airflow_plugins.protection.task_identity import dag_period, dag_timezone

        info = activity.info()
        task = self.catalog.operator(inp.dag_id, inp.task.task_id)
        if inp.task.kind is TaskKind.EXECUTE and inp.task.mapped:
            # a mapped operator: the item's operator, as Airflow's task runner unmaps it
            task = task.unmap(inp.map_value)
        run, ds = business_run(
            inp.dag_id,
            info.workflow_id or "",
            inp.business_date,
            period=dag_period(task.dag).value,
            timezone=dag_timezone(task.dag),
            partition_key=inp.partition_key,
            partition_date=inp.partition_date,
            airflow_run=inp.airflow_run,
        )
        # the workflow passes the results of the upstream tasks the spec's XCom markers name
        context = template_context(
            task,
            run=run,
            try_number=info.attempt,
            upstream=inp.upstream,
            ds=ds,
            upstream_xcoms=inp.upstream_xcoms,
        )
        if inp.task.mapped:
            context["ti"].map_index = inp.map_index
        assets = asset_state_stores(self.store, task, mode=inp.mode, run_id=run.run_id)
        if assets is not None:  # as Airflow: only for a task with a concrete asset
            context[ASSET_STATE] = assets
        return task, context

    @activity.defn(name="bridge.poke_sensor")
    def poke_sensor(self, inp: PokeInput) -> PokeResult:
        """Pokes a sensor once (``bridge.worker.sensing``); the workflow waits between pokes.

        No lease: a poke only reads its condition, and a sensor that fired is not run again in
        the same workflow (a rerun pokes again, as a cleared sensor does in Airflow). A shadow
        run's poke connects to nothing but Temporal and ``BRIDGE_SHADOW_ALLOW`` (as any shadow
        task that is not declared side-effect-free).
        """
        try:
            task, context = self._operator_context(inp.task)
            if inp.task.mode is RunMode.SHADOW and not inp.task.task.side_effect_free:
                with no_egress(allowed_addresses(None)):  # a shadow's poke reaches nobody
                    return poke_once(task, context, execute=inp.execute)
            return poke_once(task, context, execute=inp.execute)
        except ApplicationError:
            raise
        except BaseException as exc:
            raise _as_application_error(exc) from exc

    @activity.defn(name="bridge.compare_run")
    def compare_run(self, inp: CompareInput) -> Comparison:
        """Compares a finished shadow run with the primary's (pending while the primary runs)."""
        try:
            return compare_run(self.store, inp)
        except LeaseStoreUnavailable as exc:
            raise ApplicationError(str(exc), type="LeaseStoreUnavailable") from exc

    @activity.defn(name="bridge.finish_run")
    def finish_run(self, result: DagRunResult) -> None:
        """Records a finished primary run: the run key's lease (so a late handover finds it
        done without starting anything), its audit row, and its side of the comparison."""
        info = activity.info()
        key = str(run_key(result.dag_id, result.business_date, result.partition_key))
        holder = Holder.temporal(
            workflow_id=info.workflow_id or "",
            workflow_run_id=info.workflow_run_id or "",
            activity_id=info.activity_id,
            attempt=info.attempt,
        )
        summary = {t: o.status for t, o in result.tasks.items()}
        if result.status == "success":
            got = self.store.acquire(key, holder, business_date=first_day(result.business_date))
            if got.granted:
                self.store.complete(got.lease, {"status": result.status, "tasks": summary})
        else:
            self.store.record_event(
                key,
                "temporal_run_failed",
                outcome="failed",
                holder=holder,
                business_date=first_day(result.business_date),
                output=summary,
                duration_ms=result.duration_ms,
            )
        record_primary(self.store, result)

    @activity.defn(name="bridge.fixed_mode")
    def fixed_mode(self, inp: FixedModeInput) -> str:
        """The cutover mode fixed for one run (the first caller fixes it)."""
        return self.modes.fix_for_run(inp.dag_id, inp.run_id).value

    def all(self) -> list[Any]:
        """Every activity of this object, for a Worker."""
        return [
            self.run_task,
            self.poke_sensor,
            self.compare_run,
            self.finish_run,
            self.fixed_mode,
        ]


class _Heartbeat:
    """Heartbeats the activity from a thread while the task's code runs.

    Cancelled (by the workflow, a user, or the server after a timeout), or given up by
    Temporal as the ``watch`` finds (retried elsewhere, or out of contact for longer than the
    heartbeat timeout), it stops the fence and abandons the lease; on worker shutdown it only
    stops the fence (the run then releases the lease as it ends)."""

    def __init__(self, timeout_s: float, fence: BridgeFence, watch: AttemptWatch | None) -> None:
        self._timeout = timeout_s
        self._every = max(0.2, timeout_s / 3)
        self._fence = fence
        self._watch = watch
        self._keeper: LeaseKeeper | None = None
        self._keeper_lock = threading.Lock()
        self._info = activity.info()
        self._done = threading.Event()
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._run,), daemon=True)

    def _run(self) -> None:
        heard_from = time.monotonic()  # when Temporal last said it wants this attempt
        asked = 0.0
        while not self._done.wait(self._every):
            try:
                heard_from, asked = self._beat(heard_from, asked)
            except Exception:  # the heartbeat thread must outlive any one failure
                activity.logger.exception("bridge: heartbeat round failed; going on")

    def _beat(self, heard_from: float, asked: float) -> tuple[float, float]:
        """One heartbeat round; returns when Temporal last wanted the attempt, and was asked."""
        try:
            activity.heartbeat()
        except Exception:  # a heartbeat that cannot be sent is not the work's failure
            pass
        if activity.is_cancelled():
            self._give_up("the activity was cancelled")
        elif activity.is_worker_shutdown():
            self._fence.stop("the worker is shutting down")
        elif self._watch is not None and time.monotonic() - asked >= self._timeout / 2:
            asked = time.monotonic()
            answer = self._watch.ask(self._info)
            if answer is Attempt.WANTED:
                heard_from = asked
            elif answer is Attempt.GIVEN_UP:
                self._give_up("Temporal retried this activity elsewhere")
            elif asked - heard_from > self._timeout:
                self._give_up(
                    f"cut off from Temporal for more than the {self._timeout:g} s heartbeat "
                    "timeout: Temporal has given this attempt up"
                )
        return heard_from, asked

    def _give_up(self, reason: str) -> None:
        """Temporal gave this attempt up: stop the body and stop renewing, so a retry takes
        over at expiry with a higher token even if this body never checks its fence."""
        self._fence.stop(reason)
        with self._keeper_lock:
            # only while the body runs: once it returned, the keeper renews on while the
            # result is recorded (the work is done; stopping now would only re-run it)
            keeper = self._keeper
            if keeper is not None and not keeper.lost:
                keeper.abandon(reason)

    @contextlib.contextmanager
    def watching(self, keeper: LeaseKeeper) -> Iterator[None]:
        """While the body runs: a cancelled attempt abandons the lease ``keeper`` renews."""
        with self._keeper_lock:
            self._keeper = keeper
        try:
            yield
        finally:
            with self._keeper_lock:
                self._keeper = None

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)


def _wait(expires_at: datetime | None) -> float:
    if expires_at is None:
        return 1.0
    remaining = (expires_at - datetime.now(UTC)).total_seconds()
    return min(MAX_WAIT_S, max(0.5, remaining + 0.2))


def _who(holder: Holder | None) -> str | None:
    return holder.describe() if holder else None


def _as_application_error(exc: BaseException) -> ApplicationError:
    if isinstance(exc, ApplicationError):
        return exc
    if isinstance(exc, TaskCodeNotFound):
        return ApplicationError(str(exc), type="TaskCodeNotFound", non_retryable=True)
    if isinstance(exc, ShadowEgressRefused):  # a shadow reaching the world fails loudly, once
        return ApplicationError(str(exc), type="ShadowEgressRefused", non_retryable=True)
    if type(exc).__name__ in _FAIL_NOW:  # retrying cannot fix it (Airflow does not retry it)
        return ApplicationError(str(exc), type="TaskFailedNoRetry", non_retryable=True)
    if isinstance(exc, FenceStopped):  # stopped, also when it returned a partial result
        return ApplicationError(str(exc), type="FenceStopped")
    if isinstance(exc, StaleToken | LeaseLost):
        return ApplicationError(str(exc), type=type(exc).__name__)
    return ApplicationError(str(exc), type=type(exc).__name__)
