"""One poke of a sensor inside a worker: its ``poke(context)``, judged as Airflow judges it.

The workflow owns the wait (durable timers between pokes, the timeout in workflow time); an
activity only asks the condition once. What a poke's outcome means is
``BaseSensorOperator.execute``'s: a truthy return (or a ``PokeReturnValue`` that is done) fires
the sensor with the ``xcom_value``; ``AirflowSkipException`` skips it;
``AirflowFailException`` / ``AirflowSensorTimeout`` / ``AirflowTaskTimeout`` fail it at once, or
skip it under ``soft_fail`` / ``never_fail``; any other error fails the attempt (retried by the
task's retries) unless ``silent_fail`` (not fired) or ``never_fail`` (skipped).

A deferrable sensor's first poke runs its ``execute`` instead, as Airflow does: returning is
firing (``TimeDeltaSensor`` returns ``True`` when its moment has passed), a deferral to a time
trigger (``DateTimeTrigger``, ``TimeDeltaTrigger``) hands the workflow its moment to sleep to,
and any other deferral is polled with the class's own ``poke``.
"""

from __future__ import annotations

import contextvars
from datetime import timedelta
from typing import Any, cast

from temporalio.exceptions import ApplicationError

from bridge.spec import PokeResult
from bridge.worker.execution import _per_thread_current_context

#: Errors of a poke that fail the sensor at once (skip it under soft_fail / never_fail).
_FAIL_NOW = ("AirflowSensorTimeout", "AirflowTaskTimeout", "AirflowFailException")


def poke_once(task: Any, context: dict[str, Any], *, execute: bool) -> PokeResult:
    """Renders the sensor's templated fields and pokes it once (``execute`` for the first poke
    of a deferrable sensor).

    Raises:
        ApplicationError: the sensor failed (non-retryable when Airflow fails it at once).
        Exception: any other error of the poke (the attempt fails and is retried).
    """
    from airflow.sdk import PokeReturnValue
    from airflow.sdk.bases.operator import ExecutorSafeguard
    from airflow.sdk.definitions.context import Context
    from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred
    from airflow.sdk.execution_time.context import set_current_context

    _per_thread_current_context()
    task._lock_for_execution = True
    with set_current_context(cast(Context, context)):
        task.render_template_fields(context)
        try:
            if execute:
                calls = contextvars.copy_context()
                calls.run(ExecutorSafeguard.tracker.set, task)
                returned = calls.run(type(task).execute, task, context)
                return PokeResult("fired", returned, dict(context["ti"].pushed))
            got = task.poke(context)
        except TaskDeferred as deferred:
            return _deferred(deferred)
        except AirflowSkipException:
            return PokeResult("skipped")
        except BaseException as exc:  # AirflowTaskTimeout is a BaseException
            fails_now = {c.__name__ for c in type(exc).__mro__} & set(_FAIL_NOW)
            if not fails_now and not isinstance(exc, Exception):
                raise
            if fails_now:
                if task.soft_fail or getattr(task, "never_fail", False):
                    return PokeResult("skipped")
                raise ApplicationError(
                    str(exc), type="TaskFailedNoRetry", non_retryable=True
                ) from exc
            if getattr(task, "silent_fail", False):
                got = False
            elif getattr(task, "never_fail", False):
                return PokeResult("skipped")
            else:
                raise
    if not got:
        return PokeResult("waiting")
    value = got.xcom_value if isinstance(got, PokeReturnValue) else None
    return PokeResult("fired", value, dict(context["ti"].pushed))


def _deferred(deferred: Any) -> PokeResult:
    """What a deferral waits for: a time trigger's moment, or (None) its sensor's condition."""
    timeout = deferred.timeout
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    moment = None
    if type(deferred.trigger).__name__ in ("DateTimeTrigger", "TimeDeltaTrigger"):
        moment = deferred.trigger.moment.isoformat()
    return PokeResult("deferred", until=moment, timeout_s=timeout)
