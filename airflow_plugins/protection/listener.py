"""The listener: audits protected DAG runs and tries, flags duplicate runs, fails failed tries.

Registered by the plugin. It observes; it never guards: Airflow 3 swallows listener exceptions,
so the guarantee lives in the operator and the policy wrapper. DAG-run hooks write one audit row
per run and state and flag a second run of a business date (``record_dag_run``); task hooks
audit failed and skipped tries and fail a failed try's lease on its behalf when its holder is
shown gone (``fail_running_lease``); ``on_starting`` warms the lease-store client before an
executor forks. A try's start and success are not written here: the lease store's own
``acquire`` and ``complete`` rows record them. The hooks never raise and never touch Airflow's
ORM session; an unreachable store pauses them for ``PAUSE_AFTER_FAILURE``. The user's account:
docs/airflow_plugin.md, "The listener".
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow.listeners import hookimpl

from airflow_plugins.lease import Holder, InvalidLeaseInput, LeaseStore, LeaseStoreUnavailable
from airflow_plugins.lease.keys import (
    first_day,
    lease_key,
    partitioned_date,
    resolve_business_date,
)
from airflow_plugins.protection import config
from airflow_plugins.protection.task_identity import (
    dag_period,
    dag_timezone,
    run_moment,
    target_from_context,
    try_holder,
)

log = logging.getLogger(__name__)

DAG_RUN_TASK = "_dag_run"
ACTOR = "listener"
CONNECT_TIMEOUT = 2.0
PAUSE_AFTER_FAILURE = 30.0
# a lease not renewed for this many heartbeats has a holder shown gone
MISSED_HEARTBEATS = 2
_RUN_EVENTS = ("dag_run_running", "dag_run_success", "dag_run_failed")

_lock = threading.Lock()
_paused_until = 0.0
_seen: set[tuple[Any, ...]] = set()


def _store(*, in_task: bool = False, task: Any = None) -> LeaseStore | None:
    """The lease store for hooks, or None while paused after a failure.

    Only a hook running in a task process may read the Connection through Airflow (the task
    SDK asks the supervisor); elsewhere the DSN must come from config or the environment.
    In the task process, a task with its own ``lease_conn_id`` is audited in its own store.
    """
    if time.monotonic() < _paused_until:
        return None
    if in_task:  # the same pool the protected body's lease uses: one connection per try
        return config.task_lease_store(getattr(task, "lease_conn_id", None) or None)
    return config.lease_store(config.lease_dsn(metastore=False), connect_timeout=CONNECT_TIMEOUT)


def _guarded(what: str, action: Callable[[], None]) -> None:
    """Runs a hook's work; logs and swallows every error (a hook must never disturb Airflow)."""
    global _paused_until
    try:
        if not config.enabled():
            return
        action()
    except LeaseStoreUnavailable as exc:
        with _lock:
            _paused_until = time.monotonic() + PAUSE_AFTER_FAILURE
        log.warning("exactly-once listener: %s skipped, lease store unavailable: %s", what, exc)
    except InvalidLeaseInput as exc:
        log.info("exactly-once listener: %s skipped: %s", what, exc)
    except Exception:
        log.exception("exactly-once listener: %s failed", what)


def _first_time(*event: Any) -> bool:
    with _lock:
        if event in _seen:
            return False
        _seen.add(event)
        return True


# -- component start --------------------------------------------------------------------------


@hookimpl
def on_starting(component: Any) -> None:
    """An Airflow job is starting: in the scheduler, before its LocalExecutor forks workers.

    Opens one lease-store connection, runs the warm-up's statements on it
    (``LeaseStore.warm_up``: nothing is written) and closes it. Every process forked afterwards
    (each executor worker, and each task process forked from a worker) then starts with libpq
    and psycopg initialised and those statements converted, which each protected try's first
    connection then does not pay. Nothing stays open across a fork.
    Other components (the triggerer, the dag processor) do the same once; a task process's
    own start (the task runner's marker) does nothing here, its warm-up is
    ``airflow_plugins.protection.connection_warmup``. Logs one INFO line when the store was warmed
    (so a component's log shows the store was reachable as it started) and a WARNING when it was
    not; an unreachable store costs the start at most ``CONNECT_TIMEOUT`` per attempt.
    """
    if type(component).__module__ != "airflow.jobs.job":
        return
    # Job() calls the hook before its runner sets job_type: name the component by its command
    job = str(getattr(component, "job_type", None) or " ".join(["airflow", *sys.argv[1:2]]))
    _guarded("on_starting", lambda: _warm_before_forks(job))


def _warm_before_forks(job: str) -> None:
    started = time.monotonic()
    store = LeaseStore(config.lease_dsn(metastore=False), connect_timeout=CONNECT_TIMEOUT)
    try:
        warmed = store.warm_up()
    finally:
        store.close()
    if warmed:
        log.info(
            "exactly-once listener: lease store warmed as an Airflow job starts (%s), before "
            "it forks: %.1f ms, nothing left open",
            job,
            (time.monotonic() - started) * 1000,
        )
    else:
        log.warning(
            "exactly-once listener: lease store not reachable as an Airflow job starts (%s); "
            "protected tasks defer until it is back",
            job,
        )


# -- DAG runs ---------------------------------------------------------------------------------


def _protected_task(task: Any) -> bool:
    module = str(getattr(task, "_task_module", "") or getattr(type(task), "__module__", ""))
    kind = str(getattr(task, "task_type", "") or type(task).__name__)
    return module.startswith("airflow_plugins.") or "ExactlyOnce" in kind


def dag_is_protected(dag: Any) -> bool:
    """Whether a DAG is protected: it opted in by tag, or it has an exactly-once task."""
    if dag is None:
        return False
    if config.opt_in_tag() in set(getattr(dag, "tags", None) or ()):
        return True
    return any(_protected_task(t) for t in getattr(dag, "tasks", None) or ())


def _run_holder(dag_run: Any) -> Holder:
    return Holder(engine="airflow", dag_id=dag_run.dag_id, run_id=dag_run.run_id)


def _runs_by_state(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The last recorded DAG-run event of each run id in a key's history."""
    last: dict[str, str] = {}
    for row in rows:
        if row["event"] in _RUN_EVENTS:
            last[str((row.get("holder") or {}).get("run_id"))] = row["event"]
    return last


def record_dag_run(dag_run: Any, event: str) -> None:
    """Audits one DAG-run state of a protected DAG, once; flags a duplicate business run.

    The row (``dag_run_running`` / ``dag_run_success`` / ``dag_run_failed``) is keyed
    ``<dag_id>/_dag_run/<business date>`` and written once per run and state (checked against
    the key's audit history). A run starting while another run of its business date is running,
    or after one succeeded, gets a ``duplicate_run`` row (outcome ``flagged``); its protected
    tasks are then held or handed the recorded result by their own leases.
    """
    dag = getattr(dag_run, "dag", None)
    if not dag_is_protected(dag):
        return
    business_date = resolve_business_date(
        getattr(dag_run, "conf", None) or {},
        run_moment(dag_run),
        period=dag_period(dag),
        timezone=dag_timezone(dag),
    )
    store = _store()
    if store is None:
        return
    # one partition of a partitioned DAG's business date is not a duplicate of another
    partition = getattr(dag_run, "partition_key", None)
    key = str(lease_key(dag_run.dag_id, DAG_RUN_TASK, partitioned_date(business_date, partition)))
    # read and record under the key's lock: two schedulers firing at once, or two runs of the
    # date starting together, each see the other's row
    with store.serialized(key):
        _record_dag_run_event(store, key, dag_run, event, business_date)


def _record_dag_run_event(
    store: LeaseStore, key: str, dag_run: Any, event: str, business_date: str
) -> None:
    runs = _runs_by_state(store.history(key))
    if runs.get(dag_run.run_id) == event:
        return  # this hook already fired for this run and state
    holder = _run_holder(dag_run)
    day = first_day(business_date)
    store.record_event(
        key,
        event,
        outcome=event.removeprefix("dag_run_"),
        holder=holder,
        business_date=day,
        input={"conf": dict(getattr(dag_run, "conf", None) or {})},
        actor=getattr(dag_run, "triggering_user_name", None),
        reason=f"run_type={getattr(dag_run, 'run_type', None)}",
    )
    if event != "dag_run_running" or dag_run.run_id in runs:
        return
    others = sorted(
        run for run, state in runs.items() if state in ("dag_run_running", "dag_run_success")
    )
    if others:
        states = ", ".join(f"{run} ({runs[run].removeprefix('dag_run_')})" for run in others)
        store.record_event(
            key,
            "duplicate_run",
            outcome="flagged",
            holder=holder,
            business_date=day,
            actor=getattr(dag_run, "triggering_user_name", None),
            reason=f"business date {business_date} already has run(s) {states}; "
            "its protected tasks wait for or reuse their leases",
        )
        log.warning(
            "exactly-once: %s is a second run of %s %s (already: %s)",
            dag_run.run_id,
            dag_run.dag_id,
            business_date,
            states,
        )


@hookimpl
def on_dag_run_running(dag_run: Any, msg: str) -> None:
    """Audits a protected DAG run starting; flags a duplicate business run."""
    _guarded("on_dag_run_running", lambda: record_dag_run(dag_run, "dag_run_running"))


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    """Audits a protected DAG run succeeding."""
    _guarded("on_dag_run_success", lambda: record_dag_run(dag_run, "dag_run_success"))


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    """Audits a protected DAG run failing."""
    _guarded("on_dag_run_failed", lambda: record_dag_run(dag_run, "dag_run_failed"))


# -- task instances ---------------------------------------------------------------------------


def _task_is_protected(task: Any) -> bool:
    if task is None:
        return False
    from airflow_plugins.protection.operators import ExactlyOnceOperator
    from airflow_plugins.protection.policy import is_wrapped

    return isinstance(task, ExactlyOnceOperator) or is_wrapped(task)


def _in_task_process(ti: Any) -> bool:
    """Whether ``ti`` is the task SDK's runtime instance (the hook runs in the try's process),
    not the API server's ORM row of a try a user marked."""
    return type(ti).__name__ == "RuntimeTaskInstance"


def _runtime_key(ti: Any) -> tuple[str, Any] | None:
    """The lease key and first day of a try running in this task process, if protected."""
    task = getattr(ti, "task", None)
    if not _in_task_process(ti) or not _task_is_protected(task):
        return None
    target = target_from_context(
        ti.get_template_context(),
        period=getattr(task, "period", None),
        timezone=getattr(task, "business_timezone", None),
    )
    return str(target.key), target.first_day


def record_try(ti: Any, event: str, error: object = None) -> None:
    """Audits one try state of a protected task, once per process."""
    found = _runtime_key(ti)
    if found is None:
        return
    holder = try_holder(ti)
    if not _first_time(event, found[0], holder.run_id, holder.map_index, holder.try_number):
        return
    store = _store(in_task=True, task=getattr(ti, "task", None))
    if store is None:
        return
    store.record_event(
        found[0],
        event,
        outcome=event.removeprefix("try_"),
        holder=holder,
        business_date=found[1],
        reason=None if error is None else str(error)[:2000],
    )


def fail_running_lease(ti: Any, error: object) -> list[str]:
    """Fails, on behalf of a failed try, the running lease that try holds; returns the keys.

    Works from the try's identity alone (no DAG needed), so it also serves a try marked failed
    through the API server. Matches only a lease still held by that try: repeated calls and
    tries whose operator already failed its lease change nothing. Failing it lets the next try
    be granted at once instead of waiting for the TTL, but only when its holder is shown gone:
    the hook runs in the holder's own process (the try reports its own end), or the holder's
    process is verified dead on this host, or its lease has missed renewals for at least
    ``MISSED_HEARTBEATS`` heartbeats. Airflow's word alone ("killed externally", a try reset or
    failed by a scheduler that adopted it) is not enough: the process may still run, and a retry
    granted beside it would overlap it; such a lease is left to end with its work or by expiry.
    A try killed with SIGKILL fires no hook in its own process: lease expiry releases it.
    """
    in_task = _in_task_process(ti)
    if in_task and not _task_is_protected(getattr(ti, "task", None)):
        return []
    store = _store(in_task=in_task, task=getattr(ti, "task", None) if in_task else None)
    if store is None:
        return []
    holder = try_holder(ti)
    match: dict[str, Any] = {
        "engine": "airflow",
        "dag_id": holder.dag_id,
        "run_id": holder.run_id,
        "task_id": holder.task_id,
        "map_index": holder.map_index,
        # always exactly this try: a late report of an old try must never fail a newer try's
        # lease (if the number were off, the lease would only wait out its TTL: the safe side)
        "try_number": holder.try_number,
    }
    failed = []
    prefix = f"{holder.dag_id}/{holder.task_id}/"
    reason = f"try failed: {error}"[:2000]
    for row in store.list_leases(prefix=prefix, state="running", limit=1000):
        stored = row.get("holder") or {}
        if not all(stored.get(k) == v for k, v in match.items()):
            continue
        if _holder_gone(stored, in_task=in_task):
            # this very process, or a dead one: match it exactly, it cannot renew again
            exact = {**match, "host": stored.get("host"), "pid": stored.get("pid")}
            token = store.fail_on_behalf(row["key"], exact, actor=ACTOR, reason=reason)
        else:
            token = store.fail_on_behalf(
                row["key"],
                match,
                actor=ACTOR,
                reason=reason,
                silent_for=MISSED_HEARTBEATS * config.heartbeat(),
            )
            if token is None:
                log.info(
                    "exactly-once: %s: Airflow reports the try failed, but its holder still "
                    "renews the lease: left to end with its work or by expiry",
                    row["key"],
                )
        if token is not None:
            failed.append(str(row["key"]))
    return failed


def _holder_gone(stored: Mapping[str, Any], *, in_task: bool) -> bool:
    """Whether the lease's holder is shown gone without waiting for missed renewals: the hook
    runs in the holder's own process (its try has ended), or the holder ran on this host and
    its process no longer exists."""
    if stored.get("host") != socket.gethostname():
        return False
    pid = stored.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return in_task
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists (another user's process)
    return False


@hookimpl
def on_task_instance_running(previous_state: Any, task_instance: Any) -> None:
    """A try starts in its own task process: an unprotected task's run may be due a shadow.

    The configured router decides (``task_started(ti)``, when it has one: the bridge's starts
    the whole-DAG Temporal shadow of an ordinary DAG in ``shadow`` mode, detached, never
    waited for). Never in the scheduler: the hook acts only on the task SDK's runtime instance.
    """

    def act() -> None:
        if not _in_task_process(task_instance) or _task_is_protected(
            getattr(task_instance, "task", None)
        ):
            return
        from airflow_plugins.protection.routing import current_router

        started = getattr(current_router(), "task_started", None)
        if callable(started):
            started(task_instance)

    _guarded("on_task_instance_running", act)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """Audits a protected try failing and fails the lease it still holds."""

    def act() -> None:
        record_try(task_instance, "try_failed", error)
        fail_running_lease(task_instance, error)

    _guarded("on_task_instance_failed", act)


@hookimpl
def on_task_instance_skipped(previous_state: Any, task_instance: Any) -> None:
    """Audits a protected try skipping itself."""
    _guarded("on_task_instance_skipped", lambda: record_try(task_instance, "try_skipped"))
