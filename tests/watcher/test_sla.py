"""The schedule-lag summary the runs page shows: nearest-rank p95 and p99.9 against targets."""

from __future__ import annotations

from airflow_plugins.protection.sla import percentile, summarise


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 1001)]  # 1..1000 s
    assert percentile(values, 0.95) == 950.0
    assert percentile(values, 0.999) == 999.0
    assert percentile([], 0.95) is None


def test_summary_against_60_s_and_5_min() -> None:
    fast = [5.0] * 990 + [70.0] * 9 + [400.0]
    summary = summarise(fast)
    assert summary.count == 1000
    assert summary.p95 == 5.0
    assert summary.p95_ok is True
    assert summary.p999 == 70.0
    assert summary.p999_ok is True
    assert summary.within_60s == 0.99
    slow = summarise([30.0] * 90 + [90.0] * 10)
    assert slow.p95 == 90.0
    assert slow.p95_ok is False
    assert summarise([]).p95_ok is None
