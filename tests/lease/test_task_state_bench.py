"""``bench/task_state.py`` runs end to end on a few rounds and ends with its JSON line (a smoke
test: no figure is asserted)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ADMIN_DSN
from tests.lease.test_bench_smoke import run_bench

SCRIPT = Path(__file__).parents[2] / "bench" / "task_state.py"


def test_the_task_state_bench_prints_each_calls_figures() -> None:
    out = run_bench(SCRIPT, "--dsn", ADMIN_DSN, "--rounds", "5", timeout=120)
    assert out["rounds"] == 5
    assert {f"{c}_over_renew" for c in ("get", "set", "submit_once")} <= set(out)
