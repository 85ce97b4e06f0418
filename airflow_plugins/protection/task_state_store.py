"""``context["task_state_store"]`` of a protected try: Airflow's interface, the lease's values.

While a protected try holds its lease (``ExactlyOnceOperator``, ``@exactly_once_task``, a task
the policy wraps), its context's ``task_state_store`` is a ``LeaseTaskStateStore``: the same
methods as Airflow 3.3's ``TaskStateStoreAccessor`` (``get``, ``set(..., retention=)``,
``delete``, ``clear``), with the values kept in the lease store under the lease key
(``airflow_plugins.lease.task_state``). So every try and every DAG run of the business date
read the same values, and a superseded try's write is refused (``LeaseLost``). The context's
own store is put back when the body ends.

A **durable operator** (one using ``ResumableJobMixin``) gets its ``submit_job`` wrapped for the
try: the submission is claimed before the job is submitted and its id recorded after, through
``TaskState.submit_once``. What such an operator provides:

* ``submit_job(context)``: as for the mixin. To let the job system recognise a repeated
  submit, pass ``idempotency_key_of(context, self.external_id_key)`` to it (a client token, a
  request id, the job's name): the same for every try and run of the date; None when the
  plugin is off.
* ``find_job(idempotency_key, context)`` (optional, recommended): the id of the job submitted
  with that key, or None when there is none. A try taking over from one that died (or froze)
  between submit and record re-attaches through it; without it that try fails (no retry)
  rather than submit a second job, and names the key to look for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, MutableMapping
from datetime import timedelta
from typing import Any

from airflow_plugins.lease.fence import Fence
from airflow_plugins.lease.task_state import JobInDoubt, JobIntent, TaskState

CONTEXT_KEY = "task_state_store"
FIND_JOB = "find_job"
_MISSING = object()


class LeaseTaskStateStore:
    """The task state store of a protected try (see the module).

    Args:
        state: the lease's task state.
    """

    def __init__(self, state: TaskState) -> None:
        self._state = state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeaseTaskStateStore) and other._state is self._state

    def __hash__(self) -> int:
        return id(self._state)

    def __repr__(self) -> str:
        return f"<LeaseTaskStateStore key={self._state.key} token={self._state.lease.token}>"

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` for the business key (by any try or run)."""
        return self._state.get(key, default)

    def set(self, key: str, value: Any, *, retention: timedelta | None = None) -> None:
        """Writes ``value`` under ``key`` while this try holds the lease.

        ``retention``: a ``timedelta``, or None / ``NEVER_EXPIRE`` to keep it as long as the
        lease record (Airflow's ``[state_store] default_retention_days`` does not apply).

        Raises:
            ValueError: ``value`` is None or not JSON (``InvalidLeaseInput``).
            LeaseLost: another try holds the lease now; nothing was written.
        """
        self._state.set(key, value, retention=retention)

    def delete(self, key: str) -> None:
        """Deletes ``key``; no-op when it is not there.

        Raises:
            LeaseLost: another try holds the lease now.
        """
        self._state.delete(key)

    def clear(self) -> None:
        """Deletes every key of the business key's state.

        Raises:
            LeaseLost: another try holds the lease now.
        """
        self._state.clear()

    def _clear_backend_only(self) -> None:
        """Airflow's success path clears a custom backend's copies; the lease's values stay
        (the next run of the business date re-attaches to them)."""

    def idempotency_key(self, key: str) -> str:
        """The idempotency key of the job being submitted under ``key`` (inside
        ``submit_job``): the same for every try and run that could submit it.

        Raises:
            RuntimeError: no submission of ``key`` is in flight.
        """
        intent = self._state.intent(key)
        if intent is None:
            raise RuntimeError(
                f"{self._state.key}: no job submission of {key!r} in flight: the idempotency "
                "key is known inside submit_job only"
            )
        return intent.idempotency_key


def idempotency_key_of(context: Any, name: str) -> str | None:
    """The idempotency key of the job ``submit_job`` is submitting under ``name``, for the job
    system (a client token, a request id, the job's name); None when no lease protects the
    try (plain Airflow: nothing to pass)."""
    store = context.get(CONTEXT_KEY) if isinstance(context, MutableMapping) else None
    if isinstance(store, LeaseTaskStateStore):
        return store.idempotency_key(name)
    return None


def is_durable_operator(task: Any) -> bool:
    """Whether ``task`` uses Airflow 3.3's ``ResumableJobMixin``."""
    try:
        from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
    except ImportError:  # an Airflow before 3.3
        return False
    return isinstance(task, ResumableJobMixin)


def _fail_task(message: str) -> BaseException:
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(message)


def _durable_submit(task: Any, state: TaskState) -> Callable[[Any], Any]:
    submit = type(task).submit_job.__get__(task)
    find = getattr(task, FIND_JOB, None)
    name = str(task.external_id_key)

    def submit_job(context: Any) -> Any:
        def found(intent: JobIntent) -> Any:
            assert find is not None
            return find(intent.idempotency_key, context)

        try:
            return state.submit_once(
                name, lambda _intent: submit(context), find=None if find is None else found
            )
        except JobInDoubt as exc:
            raise _fail_task(f"exactly-once: {exc}") from exc

    return submit_job


@contextlib.contextmanager
def installed(task: Any, context: MutableMapping[str, Any], fence: Fence) -> Iterator[None]:
    """The lease's task state in ``context`` (and a durable operator's fenced ``submit_job``)
    for the duration of the block; the context's own store is put back after."""
    state = fence.state
    previous = context.get(CONTEXT_KEY, _MISSING)
    context[CONTEXT_KEY] = LeaseTaskStateStore(state)
    durable = is_durable_operator(task)
    if durable:
        task.submit_job = _durable_submit(task, state)
    try:
        yield
    finally:
        if durable:
            with contextlib.suppress(AttributeError):
                del task.submit_job
        if previous is _MISSING:
            context.pop(CONTEXT_KEY, None)
        else:
            context[CONTEXT_KEY] = previous


def with_task_state(
    task: Any, context: Any, body: Callable[[Fence], Any]
) -> Callable[[Fence], Any]:
    """``body`` run with the lease's task state installed (see ``installed``)."""

    def run(fence: Fence) -> Any:
        if not isinstance(context, MutableMapping):
            return body(fence)
        with installed(task, context, fence):
            return body(fence)

    return run
