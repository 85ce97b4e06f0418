"""Missed-run detection for protected DAGs, apart from the schedulers.

    exactly-once-watcher run       # or: python -m airflow_plugins.watcher.cli run

See ``gaps`` for what late and missed mean, ``service`` for how they are reported.
"""

from __future__ import annotations

from airflow_plugins.watcher.gaps import (
    ExpectedRun,
    LeaseRow,
    RunReport,
    RunStatus,
    WatchedDag,
    expected_runs,
    judge,
)
from airflow_plugins.watcher.reads import evaluate
from airflow_plugins.watcher.service import LookResult, Watcher, run_key

__all__ = [
    "ExpectedRun",
    "LeaseRow",
    "LookResult",
    "RunReport",
    "RunStatus",
    "WatchedDag",
    "Watcher",
    "evaluate",
    "expected_runs",
    "judge",
    "run_key",
]
