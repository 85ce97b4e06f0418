"""Schedule-lag SLA: scheduled time -> lease granted -> finished, for every protected run.

The company's service levels: 95% of jobs start within 60 s of their scheduled time, 99.9%
within 5 min. The watcher measures each protected run once it is done (scheduled time from the
DAG's timetable, first grant and last success from the lease store) and exports the lags
through Airflow's metrics (StatsD or OpenTelemetry, as ``[metrics]`` configures):

- ``exactly_once.schedule_lag.start`` (timing, ms; tag ``dag_id``): scheduled -> first grant;
- ``exactly_once.schedule_lag.finish`` (timing, ms; tag ``dag_id``): scheduled -> finished;
- ``exactly_once.schedule_lag.start_over_60s`` / ``..._over_5m`` (counters).

The views compute p95 and p99.9 from the same measurements.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

START_TARGET = timedelta(seconds=60)
TAIL_TARGET = timedelta(minutes=5)
METRIC_START = "exactly_once.schedule_lag.start"
METRIC_FINISH = "exactly_once.schedule_lag.finish"


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile (``fraction`` in (0, 1]) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclasses.dataclass(frozen=True)
class LagSummary:
    """p95 and p99.9 of start lags (seconds) against the 60 s and 5 min targets."""

    count: int
    p95: float | None
    p999: float | None
    within_60s: float | None
    within_5m: float | None

    @property
    def p95_ok(self) -> bool | None:
        """p95 within 60 s (None without data)."""
        return None if self.p95 is None else self.p95 <= START_TARGET.total_seconds()

    @property
    def p999_ok(self) -> bool | None:
        """p99.9 within 5 min (None without data)."""
        return None if self.p999 is None else self.p999 <= TAIL_TARGET.total_seconds()


def summarise(start_lags_seconds: Iterable[float]) -> LagSummary:
    """Summarises start lags in seconds."""
    values = sorted(start_lags_seconds)
    if not values:
        return LagSummary(0, None, None, None, None)
    n = len(values)
    return LagSummary(
        count=n,
        p95=percentile(values, 0.95),
        p999=percentile(values, 0.999),
        within_60s=sum(v <= START_TARGET.total_seconds() for v in values) / n,
        within_5m=sum(v <= TAIL_TARGET.total_seconds() for v in values) / n,
    )


def _stats() -> Any:
    from airflow.observability import stats

    return stats


def initialise_metrics() -> None:
    """Connects Airflow's metrics to the backend ``[metrics]`` configures (a standalone
    process such as the watcher must do this once, as Airflow's own daemons do)."""
    from airflow._shared.observability.metrics import stats
    from airflow.configuration import conf
    from airflow.observability.metrics import stats_utils

    stats.initialize(
        factory=stats_utils.get_stats_factory(),
        export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=False),
    )


def export_run_lag(dag_id: str, start_lag: timedelta | None, finish_lag: timedelta | None) -> None:
    """Exports one protected run's lags through Airflow's metrics."""
    stats = _stats()
    tags = {"dag_id": dag_id}
    if start_lag is not None:
        stats.timing(METRIC_START, start_lag, tags=tags)
        if start_lag > START_TARGET:
            stats.incr(METRIC_START + "_over_60s", tags=tags)
        if start_lag > TAIL_TARGET:
            stats.incr(METRIC_START + "_over_5m", tags=tags)
    if finish_lag is not None:
        stats.timing(METRIC_FINISH, finish_lag, tags=tags)
