"""The DAG-run workflow: a DAG's task graph as Temporal activities, and the workflows around it.

Deterministic: the graph comes in as data (``DagRunInput``), tasks start when their upstreams
have succeeded (parallel branches run at once), waits are durable timers. Large fan-outs go to
child workflows of at most ``chunk_size`` items so no history nears Temporal's event limit.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from airflow_plugins.lease import InvalidLeaseInput
    from bridge.comparison import CompareInput
    from bridge.graph import (
        direct_upstream,
        graph_problems,
        referenced,
        run_state_tasks,
        shadow_refusals,
        substitute,
        topological,
    )
    from bridge.identity import (
        expanded_items,
        keyed_items,
        map_items,
        tick_business_date,
        workflow_id,
    )
    from bridge.sensor_wait import next_poke_s
    from bridge.spec import (
        DagRunInput,
        DagRunResult,
        MappedChunkInput,
        MappedChunkResult,
        PokeInput,
        PokeResult,
        RunMode,
        ScheduledRunInput,
        TaskInput,
        TaskOutcome,
        TaskResult,
        TaskSpec,
        needs_airflow_run,
    )
    from bridge.trigger_rules import RUN, SKIPPED, decide
    from bridge.worker.activities import NON_RETRYABLE, BridgeActivities, FixedModeInput

PARALLEL_ITEMS = 50
#: runs before it handed a mapped task's results on as a dict keyed by item
MAPPED_LIST_PATCH = "mapped-results-as-list"
#: runs before it ran a mapped task over an empty upstream list as ``succeeded`` with no items,
#: and one whose every item skipped itself as ``succeeded`` (Airflow skips both)
MAPPED_SKIP_PATCH = "mapped-skips-as-airflow"
SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")


def _options(task: TaskSpec) -> dict[str, Any]:
    retry = task.retry
    return {
        "start_to_close_timeout": timedelta(seconds=task.timeout_s),
        "heartbeat_timeout": timedelta(seconds=task.heartbeat_s),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=retry.initial_interval_s),
            backoff_coefficient=retry.backoff_coefficient,
            maximum_interval=timedelta(seconds=retry.maximum_interval_s),
            maximum_attempts=retry.maximum_attempts,
            non_retryable_error_types=list(NON_RETRYABLE),
        ),
    }


async def run_activity(inp: TaskInput) -> TaskResult:
    """Runs one task's activity; while another live holder has its lease, waits on a timer.

    A held lease is not an error: the activity returns at once, the workflow sleeps (no worker
    slot, no attempt used) until about when the lease would expire, and asks again.
    """
    while True:
        result = await workflow.execute_activity_method(
            BridgeActivities.run_task, inp, **_options(inp.task)
        )
        if result.status not in ("held", "unavailable"):
            return result
        await workflow.sleep(timedelta(seconds=result.wait_s))


def _poke_options(task: TaskSpec) -> dict[str, Any]:
    """A poke: the task's attempt timeout and retries, no heartbeat (it is short)."""
    options = _options(task)
    del options["heartbeat_timeout"]
    return options


async def sense(inp: TaskInput) -> TaskOutcome:
    """Runs a sensor as ``BaseSensorOperator`` does, its waits as durable timers.

    Pokes it (an activity), and while it has not fired sleeps its poke interval (with its
    exponential backoff) on a workflow timer, until it fires (succeeded, its ``xcom_value`` the
    result), skips, or has not fired ``timeout`` after the first poke in workflow time (failed,
    or skipped with ``soft_fail``). Poke and reschedule modes wait alike. A deferrable
    sensor's first poke is its ``execute``: a deferral to a moment is one timer to it (failing
    at the deferral's timeout first, if any), any other deferral polls ``poke`` as above.
    """
    task = inp.task
    sensor = task.sensor
    assert sensor is not None
    started = workflow.now()
    timeout_s: float | None = sensor.timeout_s
    execute, pokes = sensor.deferrable, 1
    while True:
        try:
            got: PokeResult = await workflow.execute_activity_method(
                BridgeActivities.poke_sensor, PokeInput(inp, execute), **_poke_options(task)
            )
        except ActivityError as exc:
            _reraise_cancellation(exc)
            return TaskOutcome("failed", error=_error(exc))
        if got.status == "fired":
            return TaskOutcome("succeeded", got.result, xcoms=got.xcoms)
        if got.status == SKIPPED:
            return TaskOutcome(SKIPPED)
        if got.status == "deferred":
            # as Airflow: a deferral without a timeout of its own is not bounded by the sensor's
            started, timeout_s, execute = workflow.now(), got.timeout_s, False
            if got.until is not None:
                return await _sleep_until(sensor.soft_fail or sensor.never_fail, got)
        elapsed = (workflow.now() - started).total_seconds()
        if timeout_s is not None and elapsed > timeout_s:
            return _timed_out(sensor.soft_fail or sensor.never_fail, elapsed, timeout_s)
        wait = next_poke_s(sensor, inp.dag_id, task.task_id, started.isoformat(), elapsed, pokes)
        await workflow.sleep(timedelta(seconds=wait))
        pokes += 1


async def _sleep_until(skips: bool, got: PokeResult) -> TaskOutcome:
    """A deferral to a moment: one durable timer to it, or to its timeout when that is first."""
    assert got.until is not None
    wait = (datetime.fromisoformat(got.until) - workflow.now()).total_seconds()
    if got.timeout_s is not None and got.timeout_s < wait:
        await workflow.sleep(timedelta(seconds=got.timeout_s))
        return _timed_out(skips, got.timeout_s, got.timeout_s)
    if wait > 0:
        await workflow.sleep(timedelta(seconds=wait))
    return TaskOutcome("succeeded")  # what the time sensors' execute_complete returns


def _timed_out(skips: bool, elapsed: float, timeout_s: float) -> TaskOutcome:
    if skips:
        return TaskOutcome(SKIPPED)
    return TaskOutcome(
        "failed",
        error=f"Sensor has timed out; run duration of {elapsed} seconds exceeds the specified "
        f"timeout of {timeout_s}.",
    )


def _reraise_cancellation(exc: BaseException) -> None:
    """A cancelled run (a user's clear or mark-failed) ends cancelled, not failed."""
    if isinstance(exc, ActivityError | ChildWorkflowError) and isinstance(
        exc.cause, CancelledError
    ):
        raise asyncio.CancelledError(str(exc.cause)) from exc


def _error(exc: BaseException) -> str:
    cause: BaseException | None = exc
    while isinstance(cause, ActivityError | ChildWorkflowError) and cause.cause is not None:
        cause = cause.cause
    return str(cause or exc)


async def _run_items(
    template: TaskInput, items: tuple[tuple[str, Any], ...], parallel: int, offset: int = 0
) -> list[TaskResult | BaseException]:
    gate = asyncio.Semaphore(parallel)

    async def one(index: int, map_key: str, value: Any) -> TaskResult:
        async with gate:
            return await run_activity(
                TaskInput(
                    dag_id=template.dag_id,
                    business_date=template.business_date,
                    task=template.task,
                    mode=template.mode,
                    upstream=template.upstream,
                    map_key=map_key,
                    map_value=value,
                    upstream_xcoms=template.upstream_xcoms,
                    partition_key=template.partition_key,
                    partition_date=template.partition_date,
                    map_index=offset + index,
                    airflow_run=template.airflow_run,
                )
            )

    got = await asyncio.gather(
        *(one(i, k, v) for i, (k, v) in enumerate(items)), return_exceptions=True
    )
    for result in got:
        if isinstance(result, asyncio.CancelledError):
            raise result
        if isinstance(result, BaseException):
            _reraise_cancellation(result)
    return got


@workflow.defn(name="bridge.MappedChunk")
class MappedChunkWorkflow:
    """One chunk of a large fan-out: its items' activities, a bounded number at a time."""

    @workflow.run
    async def run(self, inp: MappedChunkInput) -> MappedChunkResult:
        """Runs the chunk's items; returns a result or an error text per item."""
        got = await _run_items(inp.template, inp.items, inp.concurrency, inp.offset)
        return MappedChunkResult(
            results=tuple(r if isinstance(r, TaskResult) else None for r in got),
            errors=tuple(_error(r) if isinstance(r, BaseException) else None for r in got),
        )


@workflow.defn(name="bridge.DagRun")
class DagRunWorkflow:
    """One business run of a DAG: its graph as activities, under the same leases as Airflow."""

    @workflow.run
    async def run(self, inp: DagRunInput) -> DagRunResult:
        """Runs the graph; fails with the failed tasks' errors (after recording the run)."""
        problems = graph_problems(inp.spec)
        if inp.mode is RunMode.SHADOW:
            problems += shadow_refusals(inp.spec)
        if inp.airflow_run is None:
            problems += [
                f"{need}, which only a run handed over from Airflow carries"
                for need in needs_airflow_run(inp.spec)
            ]
        if problems:
            raise ApplicationError(
                "refused before anything ran: " + "; ".join(problems),
                type="Untranslatable",
                non_retryable=True,
            )
        started = workflow.now()
        running: dict[str, asyncio.Task[TaskOutcome]] = {}
        for task in topological(inp.spec):
            ups = [running[u] for u in task.upstream]
            setups = [running[s] for s in task.setups]
            running[task.task_id] = asyncio.create_task(self._task(inp, task, ups, setups))
        outcomes = {task_id: await job for task_id, job in running.items()}
        # as Airflow: the run failed when a leaf task failed or could not run because of a
        # failure; a teardown is no leaf unless its failure fails the run (on_failure_fail_dagrun)
        leaves = [outcomes[t] for t in run_state_tasks(inp.spec)]
        failed_leaf = any(o.status in ("failed", "upstream_failed") for o in leaves)
        status = "failed" if failed_leaf else "success"
        result = DagRunResult(
            dag_id=inp.spec.dag_id,
            business_date=inp.business_date,
            mode=inp.mode,
            status=status,
            tasks=outcomes,
            duration_ms=round((workflow.now() - started).total_seconds() * 1000),
            partition_key=inp.partition_key,
        )
        await self._record(inp, result)
        if status != "success":
            failed = "; ".join(f"{t}: {o.error}" for t, o in outcomes.items() if o.error)
            raise ApplicationError(
                f"{inp.spec.dag_id} {inp.business_date} failed: {failed}",
                type="DagRunFailed",
                non_retryable=True,
            )
        return result

    async def _record(self, inp: DagRunInput, result: DagRunResult) -> None:
        short = timedelta(minutes=2)
        if inp.mode is RunMode.PRIMARY:
            await workflow.execute_activity_method(
                BridgeActivities.finish_run, result, start_to_close_timeout=short
            )
            return
        waited = 0.0
        delay = inp.compare_poll_s
        while True:
            final = waited >= inp.compare_wait_s
            verdict = await workflow.execute_activity_method(
                BridgeActivities.compare_run,
                CompareInput(inp.spec, result, final, inp.source),
                start_to_close_timeout=short,
            )
            if not verdict.pending:
                return
            # Airflow's API unreachable (the verdict says why): back off, doubling to 10 min
            delay = delay * 2 if verdict.differences else inp.compare_poll_s
            delay = min(delay, max(inp.compare_poll_s, 600.0))
            await workflow.sleep(timedelta(seconds=delay))
            waited += delay

    async def _task(
        self,
        inp: DagRunInput,
        task: TaskSpec,
        upstream: list[asyncio.Task[TaskOutcome]],
        setups: list[asyncio.Task[TaskOutcome]],
    ) -> TaskOutcome:
        ups = [await job for job in upstream]
        indirect = [(await job).status for job in setups]
        outcome = dict(zip(task.upstream, ups, strict=True))
        direct = direct_upstream(task)
        if any(task.task_id in outcome[u].skip for u in direct):  # a branch not taken
            return TaskOutcome(SKIPPED)
        is_setup = {t.task_id for t in inp.spec.tasks if t.is_setup}
        decided = decide(
            task.trigger_rule,
            [outcome[u].status for u in direct],
            setups=[outcome[u].status for u in direct if u in is_setup],
            indirect_setups=indirect,
        )
        if decided != RUN:
            return TaskOutcome(decided)
        results = {u_id: u.result for u_id, u in zip(task.upstream, ups, strict=True)}
        wanted = referenced(task)
        template = TaskInput(
            dag_id=inp.spec.dag_id,
            business_date=inp.business_date,
            task=task,
            mode=inp.mode,
            upstream={k: v for k, v in results.items() if k in wanted},
            map_key=inp.map_key,
            upstream_xcoms={
                u_id: u.xcoms
                for u_id, u in zip(task.upstream, ups, strict=True)
                if u.xcoms and u_id in wanted
            },
            partition_key=inp.partition_key,
            partition_date=inp.partition_date,
            airflow_run=inp.airflow_run,
        )
        if task.map_over is not None:
            return await self._mapped(inp, template, results[task.map_over])
        if task.expand or task.expand_kwargs is not None:
            return await self._expanded(inp, template, results)
        if task.sensor is not None:
            return await sense(template)
        try:
            done = await run_activity(template)
        except ActivityError as exc:
            _reraise_cancellation(exc)
            return TaskOutcome("failed", error=_error(exc))
        return TaskOutcome(
            SKIPPED if done.status == SKIPPED else "succeeded",
            done.result,
            None,
            done.duration_ms,
            (done.key,),
            done.captured,
            xcoms=done.xcoms,
            skip=done.skip,
        )

    async def _mapped(self, inp: DagRunInput, template: TaskInput, values: Any) -> TaskOutcome:
        task = template.task
        if not isinstance(values, list):
            return TaskOutcome("failed", error=f"{task.map_over} did not return a list to map")
        try:
            items = map_items(values, task.map_key_field)
        except InvalidLeaseInput as exc:
            return TaskOutcome("failed", error=f"{task.task_id}: {exc}")
        if not items and workflow.patched(MAPPED_SKIP_PATCH):
            return TaskOutcome(SKIPPED)  # as Airflow: a mapped task over nothing is skipped
        return await self._items(inp, template, items)

    async def _expanded(
        self, inp: DagRunInput, template: TaskInput, results: dict[str, Any]
    ) -> TaskOutcome:
        """An ``expand()`` of literal lists, several arguments or a mapped task's list: the
        cross product's items, keyed by their arguments (``bridge.identity.expanded_items``)."""
        task = template.task
        # in expand()'s order (its last argument varies fastest)
        lists = {arg: substitute(source, results) for arg, source in task.expand}
        for arg, values in lists.items():
            if not isinstance(values, list):
                return TaskOutcome("failed", error=f"{task.task_id}: {arg} is not a list to map")
        sets = substitute(task.expand_kwargs, results)
        if task.expand_kwargs is not None and (
            not isinstance(sets, list) or not all(isinstance(s, dict) for s in sets)
        ):
            return TaskOutcome("failed", error=f"{task.task_id}: not a list of argument dicts")
        try:
            items = keyed_items(sets) if task.expand_kwargs is not None else expanded_items(lists)
        except InvalidLeaseInput as exc:
            return TaskOutcome("failed", error=f"{task.task_id}: {exc}")
        if not items:  # as Airflow: a mapped task over nothing is skipped
            return TaskOutcome(SKIPPED)
        return await self._items(inp, template, items)

    async def _items(
        self, inp: DagRunInput, template: TaskInput, items: tuple[tuple[str, Any], ...]
    ) -> TaskOutcome:
        if len(items) <= inp.fanout_threshold:
            got = await _run_items(template, items, PARALLEL_ITEMS)
            results = [r if isinstance(r, TaskResult) else None for r in got]
            errors = [_error(r) if isinstance(r, BaseException) else None for r in got]
        else:
            results, errors = await self._chunks(template, items, max(1, inp.chunk_size))
        return _merge(items, results, errors)

    async def _chunks(
        self, template: TaskInput, items: tuple[tuple[str, Any], ...], size: int
    ) -> tuple[list[TaskResult | None], list[str | None]]:
        parent = workflow.info().workflow_id
        jobs = [
            workflow.execute_child_workflow(
                MappedChunkWorkflow.run,
                MappedChunkInput(template, items[i : i + size], PARALLEL_ITEMS, offset=i),
                id=f"{parent}/{template.task.task_id}/{i // size}",
            )
            for i in range(0, len(items), size)
        ]
        results: list[TaskResult | None] = []
        errors: list[str | None] = []
        for n, got in enumerate(await asyncio.gather(*jobs, return_exceptions=True)):
            if isinstance(got, asyncio.CancelledError):
                raise got
            if isinstance(got, BaseException):
                _reraise_cancellation(got)
            count = len(items[n * size : (n + 1) * size])
            if isinstance(got, BaseException):
                results += [None] * count
                errors += [_error(got)] * count
            else:
                results += list(got.results)
                errors += list(got.errors)
        return results, errors


def _merge(
    items: tuple[tuple[str, Any], ...],
    results: list[TaskResult | None],
    errors: list[str | None],
) -> TaskOutcome:
    values: dict[str, Any] = {}
    keys: list[str] = []
    captured_items: list[str] = []
    captured_rows: dict[str, list[Any]] = {}
    captured_calls: list[dict[str, Any]] = []
    duration = 0
    for (map_key, _), done in zip(items, results, strict=True):
        if done is None:
            continue
        values[map_key] = done.result
        keys.append(done.key)
        duration += done.duration_ms
        captured_items += [f"{map_key}/{i}" for i in done.captured.get("items", [])]
        for table, rows in done.captured.get("rows", {}).items():
            captured_rows.setdefault(table, []).extend(rows)
        captured_calls += done.captured.get("calls", [])  # items' own names, as the primary's
    failed = [f"{k}: {e}" for (k, _), e in zip(items, errors, strict=True) if e is not None]
    captured: dict[str, Any] = {}
    if captured_items or captured_rows or captured_calls:
        captured = {"items": captured_items, "rows": captured_rows, "calls": captured_calls}
    result: Any = values
    if workflow.patched(MAPPED_LIST_PATCH):
        # as Airflow hands a mapped task's results on: a list in map index order (the items'
        # order), of the items that returned something (Airflow pushes no XCom for None)
        result = [v for v in values.values() if v is not None]
    status = "failed" if failed else "succeeded"
    ran = [done for done in results if done is not None]
    if not failed and ran and all(done.status == SKIPPED for done in ran):
        if workflow.patched(MAPPED_SKIP_PATCH):
            status = SKIPPED  # every item skipped itself: Airflow's downstream rules see skips
    error = "; ".join(failed[:10]) if failed else None
    return TaskOutcome(
        status, result, error, duration, tuple(keys), {} if failed else captured, items=values
    )


@workflow.defn(name="bridge.ScheduledDag")
class ScheduledDagWorkflow:
    """What a Temporal Schedule starts in ``temporal-scheduled`` mode.

    It derives the business date from the schedule's nominal time, checks that the DAG is still
    in ``temporal-scheduled`` (a rollback stops scheduled runs at once), and starts the DAG-run
    workflow as a child with the key-derived id, so a handover of the same run cannot start a
    second execution.
    """

    @workflow.run
    async def run(self, inp: ScheduledRunInput) -> str:
        """Starts (or finds) the business run of this schedule tick; returns what it did."""
        spec = inp.spec
        nominal = workflow.info().typed_search_attributes.get(SCHEDULED_START) or workflow.now()
        business_date = tick_business_date(spec, nominal)
        mode = await workflow.execute_activity_method(
            BridgeActivities.fixed_mode,
            FixedModeInput(spec.dag_id, f"scheduled__{business_date}"),
            start_to_close_timeout=timedelta(minutes=1),
        )
        if mode != "temporal-scheduled":
            return f"skipped {business_date}: {spec.dag_id} is in mode {mode}"
        try:
            await workflow.start_child_workflow(
                DagRunWorkflow.run,
                DagRunInput(spec, business_date, RunMode.PRIMARY, source="temporal-schedule"),
                id=workflow_id(spec.dag_id, business_date),
                task_queue=inp.task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            )
        except WorkflowAlreadyStartedError:
            return f"{business_date}: already started by a handover; not started twice"
        return f"started {business_date}"
