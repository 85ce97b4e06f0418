"""Polling with a deadline: the lease tests wait for conditions, never for fixed times."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from airflow_plugins.demo.stack import wait_until

T = TypeVar("T")


def wait_for(condition: Callable[[], T], *, timeout: float = 30.0, every: float = 0.05) -> T:
    """Calls ``condition`` until it returns something truthy; returns that value.

    Raises:
        TimeoutError: the condition stayed falsy for ``timeout`` seconds.
    """
    value: T = wait_until(condition, timeout=timeout, interval=every, what=str(condition))
    return value
