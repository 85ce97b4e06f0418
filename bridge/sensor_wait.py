"""How long a sensor waits between two pokes: ``BaseSensorOperator._get_next_poke_interval``.

Pure (no Airflow, no Temporal): the DAG-run workflow calls it between pokes, so the wait is a
durable timer. Under ``exponential_backoff`` the wait doubles from ``poke_interval`` with the
same SHA-1 jitter Airflow uses, keyed by the first poke's workflow time (deterministic on
replay), capped by what is left of the timeout and by ``max_wait``.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

from bridge.spec import SensorSpec


def next_poke_s(
    sensor: SensorSpec, dag_id: str, task_id: str, started: str, elapsed_s: float, pokes: int
) -> float:
    """The wait before poke number ``pokes + 1``, after ``pokes`` pokes ``elapsed_s`` into it."""
    if not sensor.exponential_backoff:
        return sensor.poke_interval_s
    min_backoff = max(int(sensor.poke_interval_s * (2 ** (pokes - 2))), 1)
    run_hash = int(
        hashlib.sha1(
            f"{dag_id}#{task_id}#{started}#{pokes}".encode(), usedforsecurity=False
        ).hexdigest(),
        16,
    )
    delay = min(min_backoff + run_hash % min_backoff, timedelta.max.total_seconds() - 1)
    interval = min(sensor.timeout_s - int(elapsed_s), delay)
    if sensor.max_wait_s:
        interval = min(sensor.max_wait_s, interval)
    return max(0.0, interval)
