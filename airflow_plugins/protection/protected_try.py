"""One protected try of a task: route, acquire, run under the lease, finish; or wait.

Shared by ``ExactlyOnceOperator``, ``@exactly_once_task`` and the tasks the cluster policy
wraps, so the three forms decide a try's outcome the same way: ``run_try`` is the entry point
and lists the outcomes; ``approve_rerun_if_asked`` is the sanctioned re-run of a succeeded
business date.
While the body runs, ``context["task_state_store"]`` is the lease's task state and a durable
operator's ``submit_job`` is fenced (``airflow_plugins.protection.task_state_store``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from airflow_plugins.lease import (
    Acquisition,
    InvalidLeaseInput,
    Lease,
    LeaseKeeper,
    LeaseLost,
    LeaseStore,
    LeaseStoreUnavailable,
    Outcome,
    connect_sink,
)
from airflow_plugins.lease.fence import Fence, SinkConnect
from airflow_plugins.lease.run import PartialResult, ResultNotRecorded, run_under_lease
from airflow_plugins.protection import (
    config,
    connection_warmup,
    early_acquire,
    recorded_result,
    routing,
    task_state_store,
)
from airflow_plugins.protection.task_identity import TaskTarget, target_from_context

log = logging.getLogger(__name__)

RERUN_CONF_KEY = "exactly_once_rerun"
LostCallback = Callable[[Fence, str], None]


@dataclasses.dataclass(frozen=True)
class Protection:
    """How a task is protected.

    Attributes:
        period: the business period (None: from the DAG's tag or schedule).
        timezone: the business timezone (None: the DAG's).
        sink_conn_id: the Airflow Connection of the sink the body writes to, if any.
        ttl: lease TTL in seconds (None: ``[exactly_once] ttl``).
        heartbeat: seconds between renewals (None: ``[exactly_once] heartbeat``).
        lease_conn_id: the task's own lease-store Connection (None: the configured store).
        resume_method: the task's method the deferrals resume into.
        on_lost: called when the lease is lost while the body runs (default: stop the fence).
    """

    period: str | None = None
    timezone: str | None = None
    sink_conn_id: str | None = None
    ttl: float | None = None
    heartbeat: float | None = None
    lease_conn_id: str | None = None
    resume_method: str = "resume_after_wait"
    on_lost: LostCallback | None = None


@dataclasses.dataclass
class _ActiveTry:
    fence: Fence
    keeper: LeaseKeeper
    store: LeaseStore
    lease: Lease


_active: _ActiveTry | None = None
_active_lock = threading.Lock()


def stop_active_try(reason: str, *, release: bool = True) -> bool:
    """Stops the protected body running in this process (``on_kill``): fence stopped, keeper
    stopped, lease released so the next try starts at once (unless ``release`` is False: the
    caller cannot stop the body and ends the process instead; the lease then expires).
    Returns whether one was running."""
    with _active_lock:
        active = _active
    if active is None:
        # killed before its work started: a grant taken early is of no use to anyone now
        return early_acquire.release_unused(reason)
    active.fence.stop(reason)
    active.keeper.stop()
    if not release:
        return True
    try:
        active.store.release(active.lease, reason)
    except (LeaseLost, LeaseStoreUnavailable) as exc:
        log.warning("releasing %s on stop: %s", active.lease.key, exc)
    return True


def active_fence() -> Fence | None:
    """The fence of the protected body running in this process, if any."""
    with _active_lock:
        return None if _active is None else _active.fence


def _sink_connect(conn_id: str | None) -> SinkConnect | None:
    if conn_id is None:
        return None

    def connect() -> Any:
        # bounded in time (keepalives, tcp_user_timeout, connect_timeout): a dead route to
        # the sink must not hold the body for TCP's retransmission time
        return connect_sink(config.sink_dsn(conn_id))

    return connect


def _fail_task(message: str) -> BaseException:
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(message)


def _retryable(message: str) -> BaseException:
    from airflow.sdk.exceptions import AirflowException

    return AirflowException(message)


def protected_run(target: TaskTarget) -> routing.ProtectedRun:
    """The routing view of a target."""
    holder = target.holder
    return routing.ProtectedRun(
        key=target.key,
        dag_id=str(holder.dag_id),
        run_id=str(holder.run_id),
        task_id=str(holder.task_id),
        map_index=-1 if holder.map_index is None else holder.map_index,
        try_number=int(holder.try_number or 0),
        run_started_at=target.run_started_at,
        conf=target.conf,
        triggering_user=target.triggering_user,
    )


def resolve_target(context: Mapping[str, Any], protection: Protection) -> TaskTarget:
    """The try's business identity; a bad or missing business date fails without retrying."""
    try:
        return target_from_context(context, period=protection.period, timezone=protection.timezone)
    except InvalidLeaseInput as exc:
        raise _fail_task(f"exactly-once: {exc}") from exc


def approve_rerun_if_asked(store: LeaseStore, target: TaskTarget) -> bool:
    """Checks the run conf's ``exactly_once_rerun`` against the approvals recorded on the key.

    A re-run of a succeeded business date is approved by an administrator where the permission
    can be checked: the pages' approve action (Op/Admin) or ``runlease override``, each audited
    under its actor. A task process cannot ask Airflow's auth manager, and anyone who may
    trigger the DAG (the plain User role) can write a run conf, so the conf
    ``{"exactly_once_rerun": {"reason": "..."}}`` approves nothing by itself: it says the run
    means to re-do a succeeded date, and the try fails (without retrying, audited
    ``rerun_request`` / ``refused`` under the triggering user) unless such an approval is
    recorded on the key; with one, the key is granted once more. Backfills map onto it the same
    way: ``reprocess_behavior="completed"`` alone re-creates the DAG runs, whose protected tasks
    then return the recorded results; to re-do the effects, approve each date's keys first.

    Returns whether the key is approved for a re-run now (the acquire will grant it).

    Raises:
        AirflowFailException: the request has no reason or the run no triggering user, or the
            key succeeded and no administrator approved a re-run of it (audited as refused).
        LeaseStoreUnavailable: the store did not answer.
    """
    if RERUN_CONF_KEY not in target.conf:
        return False
    ask = target.conf[RERUN_CONF_KEY]
    reason = ask.get("reason") if isinstance(ask, Mapping) else None
    if not isinstance(reason, str) or not reason.strip():
        raise _fail_task(f'exactly-once: {RERUN_CONF_KEY} needs a reason: {{"reason": "..."}}')
    if not target.triggering_user:
        raise _fail_task(f"exactly-once: {RERUN_CONF_KEY} needs a run triggered by a user")
    key = str(target.key)
    row = store.get(key)
    if row is None or row["state"] != "succeeded":
        return False  # nothing to re-run: the acquire decides as for any try
    if row["rerun_approved"]:
        return True
    if (row.get("holder") or {}).get("run_id") == target.holder.run_id:
        return False  # this DAG run did the re-run already: its retries get its result
    store.record_event(
        key,
        "rerun_request",
        outcome="refused",
        holder=target.holder,
        business_date=target.first_day,
        actor=target.triggering_user,
        reason=f"{reason.strip()} [dag run {target.holder.run_id}]: no approval recorded",
    )
    raise _fail_task(
        f"exactly-once: {RERUN_CONF_KEY} asks to re-run {key}, which succeeded, and the re-run "
        "is not approved: the run conf approves nothing by itself. An administrator (Op or "
        "Admin) approves it on the Exactly-once leases page or with `runlease override KEY "
        "--reason ...`; then clear this task"
    )


def _audit_input(target: TaskTarget, extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"conf": dict(target.conf)}
    if extra is not None:
        data["args"] = extra
    return data


def acquire(
    store: LeaseStore, target: TaskTarget, protection: Protection, audit_input: Any = None
) -> Acquisition:
    """Approves a requested re-run, then asks for the key's lease.

    Raises:
        LeaseStoreUnavailable: the store did not answer (the caller defers).
    """
    approve_rerun_if_asked(store, target)
    return store.acquire(
        str(target.key),
        target.holder,
        ttl=protection.ttl,
        business_date=target.first_day,
        input=_audit_input(target, audit_input),
    )


def start_early(
    task: Any, context: Mapping[str, Any], protection: Protection, audit_input: Any = None
) -> bool:
    """Starts this try's acquire while Airflow still prepares the task (``early_acquire``).

    Called once the task's templates are rendered. Only in a task runner's process about to
    run ``task`` (``connection_warmup.preparing``), with protection on, no handover router and not
    resuming from a deferral (the resume acquires itself). A sanctioned re-run is approved
    first, as always (``acquire``). Never raises: anything that stops it here leaves the acquire to
    ``execute``, which reports what is wrong.

    Returns:
        Whether the acquire started.
    """
    try:
        ti = context["ti"]
        server = getattr(ti, "_ti_context_from_server", None)
        if (
            not connection_warmup.preparing(ti.dag_id, ti.task_id)
            or not config.enabled()
            or getattr(server, "next_method", None)
            or not isinstance(routing.current_router(), routing.AirflowOnly)
        ):
            return False
        merge_arguments(task, context)
        target = target_from_context(
            context, period=protection.period, timezone=protection.timezone
        )
        store = config.task_lease_store(protection.lease_conn_id)
    except Exception as exc:  # execute acquires again and reports it
        log.debug("exactly-once: not acquiring early: %s", exc)
        return False
    return early_acquire.start(
        ti, target, store, lambda: acquire(store, target, protection, audit_input)
    )


def run_unprotected(
    context: Mapping[str, Any], protection: Protection, body: Callable[[Fence], Any]
) -> Any:
    """Runs the body plainly (``[exactly_once] enabled = False``): no lease, no fence."""
    ti = context["ti"]
    try:
        target = target_from_context(
            context, period=protection.period, timezone=protection.timezone
        )
        key, business_date = str(target.key), target.business_date
    except InvalidLeaseInput:
        key, business_date = f"{ti.dag_id}/{ti.task_id}/unknown", "unknown"
    fence = Fence.unprotected(key, business_date, _sink_connect(protection.sink_conn_id))
    try:
        return body(fence)
    finally:
        fence.close()


def run_granted(
    store: LeaseStore,
    got: Acquisition,
    target: TaskTarget,
    protection: Protection,
    body: Callable[[Fence], Any],
) -> Any:
    """Runs the body under a granted lease and finishes the lease with its outcome."""
    lease = got.lease
    if got.outcome is Outcome.TAKEN_OVER:
        log.warning(
            "exactly-once: %s taken over from token %s (%s)",
            lease.key,
            got.previous_token,
            got.previous_holder.describe() if got.previous_holder else "?",
        )
    fence = Fence(
        key=lease.key,
        token=lease.token,
        attempt=lease.attempt,
        business_date=target.business_date,
        lease=lease,
        sink_connect=_sink_connect(protection.sink_conn_id),
    )

    @contextlib.contextmanager
    def registered(keeper: LeaseKeeper) -> Iterator[None]:
        global _active
        with _active_lock:
            _active = _ActiveTry(fence, keeper, store, lease)
        try:
            yield
        finally:
            with _active_lock:
                _active = None

    def skipped(exc: BaseException) -> str | None:
        if type(exc).__name__ == "AirflowSkipException":
            return "the task skipped itself: the work was not done"
        return None

    try:
        return run_under_lease(
            store,
            fence,
            body,
            interval=min(protection.heartbeat or config.heartbeat(), lease.ttl / 2),
            complete_timeout=config.complete_timeout(),
            encode=recorded_result.encode,
            releases=skipped,
            on_lost=protection.on_lost,
            while_running=registered,
        )
    except PartialResult as exc:
        raise _retryable(
            f"exactly-once: {lease.key}: the work was stopped ({fence.stop_reason}) and returned a "
            "partial result; not recording it: the next try finishes the work"
        ) from exc
    except ResultNotRecorded as exc:
        message = f"exactly-once: {exc}"
        raise (_fail_task(message) if exc.final else _retryable(message)) from exc


def resume_handover(
    task: Any, context: Mapping[str, Any], protection: Protection, event: Any
) -> Any:
    """Continues a handover after its deferral: the router's handover resumes.

    Raises:
        AirflowException: the router no longer hands this run over (nothing to resume).
    """
    target = resolve_target(context, protection)
    run = protected_run(target)
    route = routing.current_router().route(run)
    if route.handover is None:
        raise _retryable(f"exactly-once: {target.key}: no handover to resume")
    return route.handover.resume(task, context, run, event)


def merge_arguments(task: Any, context: Mapping[str, Any]) -> None:
    """Puts a Python task's ``op_kwargs`` into its context, as ``PythonOperator`` does.

    Done before anything else, so a ``map_index_template`` over the task's arguments
    (``{{ tenant }}``) renders after the try also when the body did not run (the key had
    succeeded), and renders the same as the lease key's map key.
    """
    op_kwargs = getattr(task, "op_kwargs", None)
    if isinstance(op_kwargs, Mapping) and isinstance(context, dict):
        for name, value in op_kwargs.items():
            context.setdefault(name, value)


def run_try(
    task: Any,
    context: Mapping[str, Any],
    protection: Protection,
    body: Callable[[Fence], Any],
    *,
    audit_input: Any = None,
) -> Any:
    """One protected try of ``task``: runs, hands over, returns the recorded result, or defers.

    - granted / taken over: the sink fence is advanced to the new token, the body runs with a
      lease keeper renewing the lease, and the lease is completed with the body's result;
    - held by a live holder: the task defers on ``LeaseReleasedTrigger`` (no worker slot, no
      retry used) and acquires again when the lease is released or expires;
    - already succeeded: the body does not run; the recorded result is returned, so XCom
      downstream sees the first run's value, and the task ends **successful**, not skipped: a
      skipped task would skip its downstream tasks under the default trigger rule (a finished
      billing run must not stop the invoice mail that follows it), and the lease's audit row
      already records that this try was turned away as ``succeeded``;
    - refused (older than the retention horizon): the task fails without retrying;
    - the body fails: the lease is failed and the error re-raised, so Airflow's retries take the
      key again with a new token (a body that skips itself releases the lease instead);
    - the lease store is unreachable: the task defers on ``LeaseStoreReachableTrigger`` and
      acquires again when it answers; no retry is used up and the body never runs without a
      lease.

    Raises:
        TaskDeferred: waiting for a held lease or for the lease store (through ``task.defer``).
        AirflowFailException: no business date, a refused key, an unrecordable result.
        AirflowException: the lease store is not configured (retried by Airflow).
    """
    merge_arguments(task, context)
    if not config.enabled():
        return run_unprotected(context, protection, body)
    try:
        early = early_acquire.take(context["ti"])
    except early_acquire.StoppedBeforeWork as exc:
        raise _retryable(
            f"exactly-once: the try was stopped before its work started: {exc}"
        ) from exc
    if early is not None:  # resolved, routed (Airflow only) and acquiring since the rendering
        target, store = early.target, early.store
    else:
        target = resolve_target(context, protection)
        run = protected_run(target)
        route = routing.current_router().route(run)
        if route.handover is not None:
            log.info("exactly-once: %s handed over (mode %s)", target.key, route.mode)
            return route.handover.start(task, context, run)
        try:
            store = config.task_lease_store(protection.lease_conn_id)
        except InvalidLeaseInput as exc:
            raise _retryable(f"exactly-once: {exc}") from exc
    # the body sees the lease's task state as context["task_state_store"] (durable operators:
    # their submit_job fenced too)
    body = task_state_store.with_task_state(task, context, body)
    try:
        return _decide(task, store, target, protection, body, audit_input, early)
    finally:
        # the try is done with the store: its connection is closed now, while the task still
        # runs, not torn down with the process after Airflow's supervisor has seen the task's
        # sockets close (a failed try's listener hook opens another)
        store.close()


def check_map_collision(store: LeaseStore, got: Acquisition, target: TaskTarget) -> None:
    """Fails the try when another map index of its own DAG run holds or held its key.

    Two map indexes of one run and the same try number key alike only when their
    ``map_index_template`` renders the same name (a duplicate in the mapped list, or a template
    that does not name the item): the second would be handed the first one's result and never
    run. A lease this try was granted over such a holder is released first.

    Raises:
        AirflowFailException: the error names both map indexes and the key.
    """
    me = target.holder
    if target.key.map_key is None or me.map_index is None or me.map_index < 0:
        return
    other = got.previous_holder if got.granted else got.holder
    if (
        other is None
        or other.engine != "airflow"
        or other.run_id != me.run_id
        or other.task_id != me.task_id
        or other.map_index is None
        or other.map_index == me.map_index
        # a tenant that moved to another index after a clear runs under a later try number:
        # not a collision, it is handed its recorded result
        or other.try_number != me.try_number
    ):
        return
    if got.granted:
        store.release(got.lease, "two map indexes of one run key alike")
    raise _fail_task(
        f"exactly-once: map index {other.map_index} and map index {me.map_index} of "
        f"{me.task_id!r} in run {me.run_id!r} both render the key {target.key}: each mapped "
        "item needs a name of its own (its map_index_template), or the second is never run"
    )


def _decide(
    task: Any,
    store: LeaseStore,
    target: TaskTarget,
    protection: Protection,
    body: Callable[[Fence], Any],
    audit_input: Any,
    early: early_acquire.Early | None = None,
) -> Any:
    """Acquires the try's lease (or takes the early acquire's answer) and acts on the outcome:
    runs, defers, or returns the result."""
    try:
        got = (early.answer() if early is not None else None) or acquire(
            store, target, protection, audit_input
        )
    except LeaseStoreUnavailable as exc:
        from airflow_plugins.protection.triggers import LeaseStoreReachableTrigger

        log.warning("exactly-once: %s: lease store unreachable, waiting: %s", target.key, exc)
        task.defer(
            trigger=LeaseStoreReachableTrigger(
                poll_interval=config.wait_poll_interval(),
                conn_id=protection.lease_conn_id,
                not_before=time.time() + config.wait_at_least(),
            ),
            method_name=protection.resume_method,
        )
    check_map_collision(store, got, target)
    if got.granted:
        return run_granted(store, got, target, protection, body)
    if got.outcome is Outcome.HELD:
        from airflow_plugins.protection.triggers import LeaseReleasedTrigger

        log.info(
            "exactly-once: %s held by %s until %s; waiting",
            got.key,
            got.holder.describe() if got.holder else "?",
            got.expires_at,
        )
        task.defer(
            trigger=LeaseReleasedTrigger(
                key=got.key,
                token=got.token or 0,
                poll_interval=config.wait_poll_interval(),
                conn_id=protection.lease_conn_id,
                not_before=time.time() + config.wait_at_least(),
            ),
            method_name=protection.resume_method,
        )
    if got.outcome is Outcome.SUCCEEDED:
        log.info(
            "exactly-once: %s already succeeded (token %s); not running it again, "
            "returning the recorded result",
            got.key,
            got.token,
        )
        return recorded_result.decode(got.result)
    raise _fail_task(f"exactly-once: {got.key} refused: {got.detail}")
