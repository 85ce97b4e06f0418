"""Puts several runs of ``bench/operator_overhead.py`` side by side, by how tasks reached the
lease store, with the mean of each figure over runs and its 95% t-interval.

    .venv/bin/python bench/operator_overhead.py --parallelism 2 --agent > agent-1.out
    ...
    .venv/bin/python bench/runs_summary.py agent-*.out direct-*.out

One run's bootstrap interval is narrower than the spread between runs of the same build (the
stack, the exit waits and the host's other work differ from run to run), so compare builds
and deployments by the mean over several runs. Each input is a file whose last line is the
bench's JSON; the last line of this script's output is one JSON object too.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# t quantiles (two-sided 95%) by degrees of freedom
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}

FIGURES: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "slot_cycle_ratio": lambda r: r["slot_cycle_ratio"],
    "makespan_ratio": lambda r: r["throughput_ratio"],
    "added_p50_ms": lambda r: r["added_in_task_ms"]["p50"],
    "added_p99_ms": lambda r: r["added_in_task_ms"]["p99"],
    "added_cpu_p50_ms": lambda r: r["added_in_task_cpu_ms"]["p50"],
    "task_cpu_added_ms": lambda r: (
        r["task_process_cpu_ms"]["protected"]["p50"] - r["task_process_cpu_ms"]["plain"]["p50"]
    ),
    "store_cpu_per_try_ms": lambda r: (r["lease_store_server_cpu_ms"] or {}).get("p50"),
    "plain_cycle_ms": lambda r: r["slot_cycle_ms"]["plain"]["mean"],
}


def last_json(path: Path) -> dict[str, Any]:
    """The JSON object on the last non-empty line of ``path``.

    Raises:
        ValueError: the file does not end with the bench's JSON line.
    """
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path}: empty")
    try:
        found: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: the last line is not the bench's JSON ({exc})") from exc
    if "slot_cycle_ratio" not in found:
        raise ValueError(f"{path}: not an operator_overhead.py result")
    return found


def mean_interval(values: Sequence[float]) -> dict[str, Any]:
    """Mean and 95% t-interval over runs (no interval from one run)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": round(mean, 4), "runs": len(values), "ci95_t": None}
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return {
        "mean": round(mean, 4),
        "runs": len(values),
        "ci95_t": [round(mean - half, 4), round(mean + half, 4)],
    }


def summarise(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each way to the store (direct, PgBouncer, agent; on Celery named so, ``direct on
    celery``): every figure per run, and its mean."""
    by_way: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        way = str(result["lease_store_via"])
        if result.get("executor", "local") != "local":
            way += f" on {result['executor']}"
        by_way.setdefault(way, []).append(result)
    summary: dict[str, Any] = {}
    for way, runs in sorted(by_way.items()):
        figures: dict[str, Any] = {}
        for name, pick in FIGURES.items():
            values = [v for v in (pick(r) for r in runs) if v is not None]
            if values:
                figures[name] = {"each": [round(v, 4) for v in values]} | mean_interval(values)
        summary[way] = figures
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Prints a table per way to the store, then the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("outputs", nargs="+", type=Path, help="files the bench's stdout went to")
    args = parser.parse_args(argv)
    try:
        results = [last_json(path) for path in args.outputs]
    except (OSError, ValueError) as exc:
        print(f"runs_summary: {exc}", file=sys.stderr)
        return 2
    summary = summarise(results)
    for way, figures in summary.items():
        print(f"{way}:")
        for name, figure in figures.items():
            interval = figure["ci95_t"]
            shown = f" (95% t {interval[0]}..{interval[1]})" if interval else ""
            print(f"  {name:<22} mean {figure['mean']}{shown}  each {figure['each']}")
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
