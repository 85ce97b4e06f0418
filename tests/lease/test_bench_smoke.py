"""The benchmark script runs end to end on tiny sizes and ends with its JSON line.

Only a smoke test: no figure is asserted against a target (benchmarks are scripts, never
timed assertions in the suite).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ADMIN_DSN

SCRIPT = Path(__file__).parents[2] / "bench" / "lease_throughput.py"


def _bench_databases() -> set[str]:
    with psycopg.connect(ADMIN_DSN) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'bench_lease_%'"
        ).fetchall()
    return {str(r[0]) for r in rows}


@pytest.mark.slow
def test_the_benchmark_runs_quick_and_prints_one_json_line_last() -> None:
    before = _bench_databases()
    done = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--dsn", ADMIN_DSN, "--quick",
            "--seconds", "0.4", "--rows", "8000", "--batch", "50", "--samples", "20",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    result = json.loads(done.stdout.strip().splitlines()[-1])
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
    done = subprocess.run(
        [sys.executable, str(BACKEND_CPU), "--dsn", ADMIN_DSN, "--tries", "3"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    result = json.loads(done.stdout.strip().splitlines()[-1])
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
