"""``@exactly_once_task``: the TaskFlow form of ``ExactlyOnceOperator``.

    @exactly_once_task(sink_conn_id="billing_db")
    def charge(fence: Fence, customers: list[str]) -> dict[str, int]: ...

    charge(customers=load())              # called like any @task; Airflow never sees ``fence``

The callable takes the ``Fence`` as its first parameter or as the keyword ``fence``; the other
parameters work as in ``@task`` (XComArgs, templated values, context keys such as ``ti``),
including ``.partial(...).expand(...)`` with a ``map_index_template``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.operators import (
    FENCE_PARAMETER,
    ExactlyOnceOperator,
    call_with_fence,
    protected_defaults,
)


def _without_fence(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` as Airflow should see it: the same signature without ``fence``."""
    signature = inspect.signature(function)
    if FENCE_PARAMETER not in signature.parameters:
        raise TypeError(
            f"@exactly_once_task {function.__name__}() must take the fence: "
            f"def {function.__name__}(fence, ...)"
        )

    @functools.wraps(function)
    def shown(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("an @exactly_once_task callable runs only inside its operator")

    shown.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for p in signature.parameters.values() if p.name != FENCE_PARAMETER]
    )
    shown._exactly_once_original = function  # type: ignore[attr-defined]
    return shown


def _original(function: Callable[..., Any]) -> Callable[..., Any]:
    original: Callable[..., Any] = getattr(function, "_exactly_once_original", function)
    return original


class ExactlyOnceDecoratedOperator(DecoratedOperator, ExactlyOnceOperator):  # type: ignore[misc]
    """The operator behind ``@exactly_once_task``."""

    template_fields = ("op_args", "op_kwargs")
    custom_operator_name = "@exactly_once_task"

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Any = None,
        op_kwargs: Any = None,
        **kwargs: Any,
    ) -> None:
        shown = (
            python_callable
            if hasattr(python_callable, "_exactly_once_original")
            else _without_fence(python_callable)
        )
        super().__init__(
            kwargs_to_upstream={
                "python_callable": shown,
                "op_args": op_args,
                "op_kwargs": op_kwargs,
            },
            python_callable=shown,
            op_args=op_args,
            op_kwargs=op_kwargs,
            **kwargs,
        )

    def audit_input(self) -> Any:
        """The callable's arguments as rendered for this try."""
        return {"op_args": list(self.op_args), "op_kwargs": dict(self.op_kwargs)}

    def execute_protected(self, fence: Fence, context: Any) -> Any:
        """Calls the decorated function with the fence and its resolved arguments."""
        merged: dict[str, Any] = dict(context)
        merged.update(self.op_kwargs)  # as PythonOperator merges them, op_kwargs win
        kwargs: Mapping[str, Any] = self.determine_kwargs(merged)
        return call_with_fence(_original(self.python_callable), fence, self.op_args, kwargs)


def exactly_once_task(
    python_callable: Callable[..., Any] | None = None,
    *,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> Any:
    """Turns a function taking a ``Fence`` into a protected task (see ``ExactlyOnceOperator``).

    Args:
        python_callable: the function (when used as ``@exactly_once_task`` with no arguments).
        multiple_outputs: push a returned dict as one XCom per key.
        **kwargs: ``ExactlyOnceOperator`` and ``BaseOperator`` arguments (``sink_conn_id``,
            ``period``, ``retries``, ``map_index_template``...). The protected retry
            defaults (``retries=4``, exponential backoff) are set here, so mapped tasks get them
            too; pass ``retries=`` to change them (a DAG's ``default_args`` does not).
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=ExactlyOnceDecoratedOperator,
        **protected_defaults(kwargs),
    )
