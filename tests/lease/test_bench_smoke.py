"""The benchmark script runs end to end on tiny sizes and ends with its JSON line.

Only a smoke test: no figure is asserted against a target (benchmarks are scripts, never
timed assertions in the suite).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ADMIN_DSN

SCRIPT = Path(__file__).parents[2] / "bench" / "lease_throughput.py"


def run_bench(script: Path, *args: str, timeout: float = 240) -> dict[str, Any]:
    """Runs a bench script to its end; returns the JSON object of its last stdout line."""
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _bench_databases() -> set[str]:
    with psycopg.connect(ADMIN_DSN) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'bench_lease_%'"
        ).fetchall()
    return {str(r[0]) for r in rows}


@pytest.mark.slow
def test_the_benchmark_runs_quick_and_prints_one_json_line_last() -> None:
    before = _bench_databases()
    result = run_bench(
        SCRIPT, "--dsn", ADMIN_DSN, "--quick",
        "--seconds", "0.4", "--rows", "8000", "--batch", "50", "--samples", "20",
    )  # fmt: skip
    assert result["server"]["synchronous_commit"] == "on"
    assert result["server"]["unlogged_tables"] == 0
    for figure in ("select1", "upsert", "lease", "lease_sql"):
        for clients in (1, 4):
            assert result["throughput"][f"{figure}_per_s_{clients}"] > 0
    assert result["batch_leases_per_s"] > 0
    assert result["latency"]["rows_large"] >= 8000
    assert result["latency"]["rows_small"] < result["latency"]["rows_large"]
    assert set(result["targets"]) == {
        "lease_vs_upsert_1",
        "lease_vs_upsert_4",
        "cycles_per_s_4",
        "batch_leases_per_s",
        "latency_ratio_new_p50",
        "latency_ratio_old_p50",
    }
    assert all(isinstance(t["met"], bool) for t in result["targets"].values())
    # it dropped the database it made
    assert _bench_databases() - before == set()


BACKEND_CPU = Path(__file__).parents[2] / "bench" / "backend_cpu.py"


@pytest.mark.slow
def test_the_backend_cpu_bench_runs_and_drops_its_database() -> None:
    result = run_bench(BACKEND_CPU, "--dsn", ADMIN_DSN, "--tries", "3")
    assert result["tries_per_kind"] == 3
    figures = result["server_cpu_ms_p50"]
    for kind, first in (("with_warm_up", "start_and_warm_up"), ("without_warm_up", "start")):
        steps = figures[kind]
        assert all(steps[step] > 0 for step in (first, "acquire", "complete")), steps
        assert steps["total"] > steps[first]  # each try's total holds its start
    assert set(result["ratios"]) == {
        "total_with_over_without_warm_up",
        "on_the_try_path_with_over_without_warm_up",
    }
    with psycopg.connect(ADMIN_DSN) as conn:
        left = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = 'eo_bench_backend_cpu'"
        ).fetchall()
    assert left == []


RUNS_SUMMARY = Path(__file__).parents[2] / "bench" / "runs_summary.py"


def _bench_result(via: str, ratio: float, added_p50: float) -> dict[str, object]:
    # the fields of an operator_overhead.py result that runs_summary.py reads
    return {
        "lease_store_via": via,
        "slot_cycle_ratio": ratio,
        "throughput_ratio": ratio,
        "added_in_task_ms": {"p50": added_p50, "p99": 4 * added_p50},
        "added_in_task_cpu_ms": {"p50": 1.0},
        "task_process_cpu_ms": {"plain": {"p50": 30.0}, "protected": {"p50": 33.0}},
        "lease_store_server_cpu_ms": None,
        "slot_cycle_ms": {"plain": {"mean": 100.0}},
    }


def test_runs_summary_puts_runs_side_by_side_by_way_to_the_store(tmp_path: Path) -> None:
    files = []
    for n, (via, ratio) in enumerate([("direct", 0.9), ("direct", 1.0), ("lease agent", 0.98)]):
        path = tmp_path / f"run-{n}.out"
        path.write_text("progress\n" + json.dumps(_bench_result(via, ratio, 5.0 + n)) + "\n")
        files.append(str(path))
    summary = run_bench(RUNS_SUMMARY, *files, timeout=60)
    direct = summary["direct"]["slot_cycle_ratio"]
    assert direct["each"] == [0.9, 1.0]
    assert direct["mean"] == pytest.approx(0.95)
    # two runs: t(1) = 12.71 times the standard error 0.05
    assert direct["ci95_t"] == pytest.approx([0.95 - 0.6355, 0.95 + 0.6355], abs=1e-3)
    agent = summary["lease agent"]
    assert agent["slot_cycle_ratio"]["ci95_t"] is None  # one run has no interval
    assert agent["task_cpu_added_ms"]["mean"] == pytest.approx(3.0)
    assert "store_cpu_per_try_ms" not in agent  # no server figure in these runs

    (tmp_path / "other.out").write_text('{"not": "a bench result"}\n')
    bad = subprocess.run(
        [sys.executable, str(RUNS_SUMMARY), str(tmp_path / "other.out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "not an operator_overhead.py result" in bad.stderr


OPERATOR_OVERHEAD = Path(__file__).parents[2] / "bench" / "operator_overhead.py"


def test_slot_cycles_without_a_back_to_back_task_give_no_ratio_not_an_error() -> None:
    """On CeleryExecutor a slot may run no two tasks of a batch back to back (every gap longer
    than an exit wait): the slot-cycle figures are null, where they raised ZeroDivisionError."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("operator_overhead", OPERATOR_OVERHEAD)
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    batch = {"spans": {0: (0.0, 1.0), 1: (3.0, 4.0), 2: (0.0, 1.0)}}
    tasks = {0: {"slot_pid": 1.0}, 1: {"slot_pid": 1.0}, 2: {"slot_pid": 2.0}}
    cycles, gaps, long_gaps, slots = bench.slot_cycles(batch, tasks, 0.5)
    assert (cycles, gaps, long_gaps, slots) == ([], [], 1, 2)
    assert math.isnan(bench.pooled_ratio([(0.0, 0, 2.0, 1)]))
    assert bench.spread([], 1, mean=True) == {"p50": None, "p99": None, "mean": None}
    assert bench.pooled_ratio([(2.0, 2, 1.0, 1)]) == 1.0


ROUND_TRIPS = Path(__file__).parents[2] / "bench" / "round_trips.py"


@pytest.mark.slow
def test_the_round_trips_bench_times_each_way_on_both_loads_and_cleans_up() -> None:
    result = run_bench(ROUND_TRIPS, "--dsn", ADMIN_DSN, "--tries", "5")
    assert result["tries"] == 5
    for load in ("idle", "busy"):
        ways = result[load]
        assert set(ways) == {"new_connection", "open_connection", "agent"}
        assert all(0 < w["p50_ms"] <= w["p99_ms"] for w in ways.values()), ways
        assert ways["open_connection"]["p50_over_open_connection"] == 1.0
    with psycopg.connect(ADMIN_DSN) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'eo_bench_round_trips%'"
        ).fetchall()
    assert left == []


def test_the_external_call_bench_runs_on_tiny_sizes() -> None:
    result = run_bench(
        Path(__file__).parents[2] / "bench" / "external_call.py",
        *("--dsn", ADMIN_DSN, "--items", "16", "--rounds", "2"),
    )
    assert result["items_per_way"] == 16
    assert set(result["p50_ms"]) == {"bare", "fenced"}
    assert set(result["calls_per_s"]) == {"bare", "fenced", "many"}
    assert result["throughput_ratio"] > 0
    assert result["call_many_ratio"] > 0
