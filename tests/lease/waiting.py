"""Polling with a deadline: the lease tests wait for conditions, never for fixed times."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], *, timeout: float = 30.0, every: float = 0.05) -> T:
    """Calls ``condition`` until it returns something truthy; returns that value.

    Raises:
        TimeoutError: the condition stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s: {condition}")
        time.sleep(every)
