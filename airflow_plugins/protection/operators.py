"""``ExactlyOnceOperator``: an Airflow operator whose work runs once per business key.

The classic form of protection (``@exactly_once_task`` is the TaskFlow one, the cluster policy
the zero-code one): the work runs under a run-lease keyed by ``dag_id/task_id/business_date
[/map_key]`` and receives a ``Fence`` whose token the sink checks, so a superseded try cannot
commit. The outcomes are decided in ``airflow_plugins.protection.protected_try``, shared by all
three forms; docs/airflow_plugin.md is the user's guide.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection import protected_try
from airflow_plugins.protection.protected_try import Protection

DEFAULT_RETRIES = 4
DEFAULT_RETRY_DELAY = timedelta(seconds=30)
DEFAULT_MAX_RETRY_DELAY = timedelta(minutes=10)
DEFAULT_BACKOFF = 2.0
FENCE_PARAMETER = "fence"


def protected_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Fills the retry defaults of protected tasks (5 attempts, exponential backoff) into
    operator kwargs, keeping whatever the author or the DAG's ``default_args`` set."""
    kwargs.setdefault("retries", DEFAULT_RETRIES)
    kwargs.setdefault("retry_delay", DEFAULT_RETRY_DELAY)
    kwargs.setdefault("retry_exponential_backoff", DEFAULT_BACKOFF)
    kwargs.setdefault("max_retry_delay", DEFAULT_MAX_RETRY_DELAY)
    return kwargs


def call_with_fence(
    function: Callable[..., Any], fence: Fence, args: Collection[Any], kwargs: Mapping[str, Any]
) -> Any:
    """Calls ``function`` with the fence as its first positional argument or as ``fence=``."""
    parameters = list(inspect.signature(function).parameters.values())
    first = parameters[0] if parameters else None
    if (
        first is not None
        and first.name == FENCE_PARAMETER
        and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)
    ):
        return function(fence, *args, **kwargs)
    return function(*args, fence=fence, **kwargs)


class ExactlyOnceOperator(BaseOperator):
    """Runs its work at most once per business key, under a lease with a fencing token.

    Override ``execute_protected(fence, context)``, or pass ``python_callable`` (called as
    ``python_callable(fence, *op_args, **op_kwargs)``)::

        class ChargeCustomers(ExactlyOnceOperator):
            def execute_protected(self, fence: Fence, context: Context) -> Any: ...

        ExactlyOnceOperator(task_id="charge", python_callable=charge,
                            sink_conn_id="billing_db", op_kwargs={...})

    The lease key is ``dag_id/task_id/business_date[/map_key]``
    (``airflow_plugins.protection.task_identity``): the run conf's ``business_date`` or the
    logical date in the DAG's timezone cut to the DAG's period; mapped tasks need a
    ``map_index_template``, and a manual run with neither date fails without retrying.

    Outcomes (``airflow_plugins.protection.protected_try``): granted -> sink fence advanced,
    body run with a lease keeper, lease completed, result returned (XCom); held -> deferred on
    ``LeaseReleasedTrigger``; succeeded -> body skipped, recorded result returned, task
    SUCCESS; body error -> lease failed, error re-raised, Airflow retries; store down ->
    deferred on ``LeaseStoreReachableTrigger`` (no retry used). A sanctioned re-run needs an
    administrator's approval (leases page or ``runlease override``); the conf
    ``{"exactly_once_rerun": {"reason": "..."}}`` alone is refused, audited. The router
    (``airflow_plugins.protection.routing.current_router()``) decides per try whether the work
    runs here or an ``EngineHandover`` (the bridge) runs it, resumed by ``resume_handover``. With
    ``[exactly_once] enabled = False`` the body runs plainly with an unfenced ``Fence``.

    Args:
        sink_conn_id: Airflow Connection (postgres) of the database the work writes to;
            ``fence.transaction()`` opens its fenced transactions there.
        period: business period (``hour``/``day``/``week``/``month``/``quarter``/``year``);
            default: the DAG's ``exactly-once-period:`` tag, else its schedule's.
        business_timezone: timezone of the business date (default: the DAG's).
        lease_ttl: lease TTL in seconds (default ``[exactly_once] ttl``).
        heartbeat: seconds between lease renewals (default ``[exactly_once] heartbeat``).
        lease_conn_id: this task's own lease-store Connection (default: the configured store,
            ``[exactly_once] lease_dsn`` / ``lease_conn_id``).
        python_callable: the work, if not overriding ``execute_protected``.
        op_args: positional arguments of ``python_callable`` (templated).
        op_kwargs: keyword arguments of ``python_callable`` (templated).
        **kwargs: ``BaseOperator`` arguments; ``retries`` defaults to 4 (5 attempts) with
            exponential backoff.
    """

    template_fields: Sequence[str] = ("op_args", "op_kwargs")
    ui_color = "#d9f2e6"

    def __init__(
        self,
        *,
        sink_conn_id: str | None = None,
        period: str | None = None,
        business_timezone: str | None = None,
        lease_ttl: float | None = None,
        heartbeat: float | None = None,
        lease_conn_id: str | None = None,
        python_callable: Callable[..., Any] | None = None,
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**protected_defaults(kwargs))
        self.sink_conn_id = sink_conn_id
        self.period = period
        self.business_timezone = business_timezone
        self.lease_ttl = lease_ttl
        self.heartbeat = heartbeat
        self.lease_conn_id = lease_conn_id
        self.python_callable = python_callable
        self.op_args = list(op_args or [])
        self.op_kwargs = dict(op_kwargs or {})

    def protection(self) -> Protection:
        """How this task is protected (period, sink, TTL, heartbeat)."""
        return Protection(
            period=self.period,
            timezone=self.business_timezone,
            sink_conn_id=self.sink_conn_id,
            ttl=self.lease_ttl,
            heartbeat=self.heartbeat,
            lease_conn_id=self.lease_conn_id,
        )

    def audit_input(self) -> Any:
        """What the audit trail records as this work's input (beside the run's conf)."""
        if self.python_callable is None:
            return None
        return {"op_args": list(self.op_args), "op_kwargs": dict(self.op_kwargs)}

    def _do_render_template_fields(
        self,
        parent: Any,
        template_fields: Iterable[str],
        context: Any,
        jinja_env: Any,
        seen_oids: set[int],
    ) -> None:
        """Renders the templates (Airflow's own step, for plain and mapped tasks alike), then
        starts this try's acquire while Airflow finishes preparing the task
        (``airflow_plugins.protection.early_acquire``); ``execute`` takes its answer."""
        super()._do_render_template_fields(parent, template_fields, context, jinja_env, seen_oids)
        if parent is self:  # not a nested templated object of the task
            protected_try.start_early(self, context, self.protection(), self.audit_input())

    def execute(self, context: Any) -> Any:
        """Takes the lease and runs ``execute_protected`` once per business key (see the class)."""
        return protected_try.run_try(
            self,
            context,
            self.protection(),
            lambda fence: self.execute_protected(fence, context),
            audit_input=self.audit_input(),
        )

    def execute_protected(self, fence: Fence, context: Any) -> Any:
        """The protected work; runs only while this try holds the key's lease.

        Returns:
            A small JSON value: it is recorded on the lease and returned (XCom) by every later
            try or run of the same business key instead of running again.
        """
        if self.python_callable is None:
            raise NotImplementedError(
                f"{type(self).__name__} needs execute_protected() or a python_callable"
            )
        return call_with_fence(self.python_callable, fence, self.op_args, self.op_kwargs)

    def resume_after_wait(self, context: Any, event: Mapping[str, Any] | None = None) -> Any:
        """Where a deferral (held lease, unreachable store) resumes: acquire again."""
        if event and event.get("status") == "error":
            from airflow.sdk.exceptions import AirflowException

            raise AirflowException(f"exactly-once: waiting failed: {event.get('error')}")
        return self.execute(context)

    def resume_handover(self, context: Any, event: Any = None) -> Any:
        """Where a handover's deferral resumes: the router's handover continues."""
        return protected_try.resume_handover(self, context, self.protection(), event)

    def on_kill(self) -> None:
        """Stops the body promptly: fence stopped, keeper stopped, lease released."""
        protected_try.stop_active_try(f"task {self.task_id} killed (on_kill)")
        super().on_kill()
