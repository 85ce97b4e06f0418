"""What runs in the bridge worker: the workflows, the activities, and the worker process.

Nothing here is imported by an Airflow task process. Start it with ``python -m bridge.worker``.
"""

from typing import Any

# ``bridge.worker`` was a module: its names still answer, loaded on first use (importing this
# package must not start Temporal's worker machinery, the workflow sandbox loads it)
_FROM_LANES = {"WORKFLOWS", "build_workers", "main", "serve"}


def __getattr__(name: str) -> Any:
    if name in _FROM_LANES:
        from bridge.worker import lanes

        return getattr(lanes, name)
    raise AttributeError(f"module 'bridge.worker' has no attribute {name!r}")
