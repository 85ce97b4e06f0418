"""Celery settings that keep a re-delivered copy of a running try from failing that try.

Redis hands an unacknowledged message out again once it outlives the visibility timeout, while
its try may still run. Airflow's API server refuses the copy's start, but when the copy's
workload token has expired (it lives ``[scheduler] task_queued_timeout``, 600 s by default,
against a default visibility timeout of a day) the refusal is a 403, which the Celery provider
does not take for "already running" (it ignores only the 409): the copy's Celery task records
FAILURE under the running try's task id, the scheduler fails the running try, and a new try
starts from the top. This wraps the provider's ``execute_workload`` (Celery's documented
``task_annotations``): a *re-delivered* message whose start call the API server refuses with
403 or 409 ends as Celery's ``Ignore``, which stores no result, as the provider already does
for 409. A first delivery that is refused, and a failure of any other call, still fail.

Use it as the Celery configuration of every component:
``[celery] celery_config_options = airflow_plugins.protection.celery_config.CELERY_CONFIG``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

log = logging.getLogger(__name__)

#: The Celery task Airflow's Celery executor sends each workload as.
WORKLOAD_TASK = "execute_workload"
#: How the API server refuses to start a task instance that is not the queued try it names: 409
#: (it is running, or ended) while the workload token is valid, 403 once it has expired.
REFUSED_START = frozenset({403, 409})


def ignore_refused_redelivery(call: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a task's ``__call__``: a re-delivered message refused at start is ignored."""

    @functools.wraps(call)
    def guarded(task: Any, *args: Any, **kwargs: Any) -> Any:
        delivery = getattr(task.request, "delivery_info", None) or {}
        redelivered = bool(delivery.get("redelivered"))
        try:
            return call(task, *args, **kwargs)
        except Exception as error:
            status = _refusal_status(error)
            if not redelivered or status is None:
                raise
            from celery.exceptions import Ignore

            log.warning(
                "[%s] re-delivered message refused at start by the API server (%s): its try "
                "runs or ran elsewhere; ignored, so that try is not failed",
                task.request.id,
                status,
            )
            raise Ignore() from error

    return guarded


def _refusal_status(error: BaseException) -> int | None:
    """The API server's status when ``error`` is its refusal of the start call (``PATCH
    .../task-instances/<id>/run``), else None: a failure of any other call is not ignored."""
    from airflow.sdk.api.client import ServerResponseError

    if not isinstance(error, ServerResponseError):
        return None
    request = error.request
    if request.method != "PATCH" or not request.url.path.endswith("/run"):
        return None
    status = getattr(error.response, "status_code", None)
    return status if status in REFUSED_START else None


if "task_annotations" in DEFAULT_CELERY_CONFIG:  # merged by hand if Airflow ever sets some
    raise RuntimeError("Airflow's default Celery configuration has task_annotations of its own")

CELERY_CONFIG: dict[str, Any] = {
    **DEFAULT_CELERY_CONFIG,
    "task_annotations": {WORKLOAD_TASK: {"@__call__": ignore_refused_redelivery}},
}
