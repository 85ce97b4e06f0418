"""The whole-DAG bench (``bench/bridge_overhead.py --whole-dag``): its DAG and that it runs.

No figure is asserted against a target (benchmarks are scripts, never timed assertions in the
suite). The run itself starts an Airflow stack and a worker (about a minute): ``extended``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_plugins.demo.stack import free_port_block
from bridge.in_airflow.translate import translate
from tests.bridge.corpus import dag_bag
from tests.lease.test_bench_smoke import run_bench

BENCH = Path(__file__).parents[2] / "bench"


def test_the_bench_dag_is_twenty_tasks_with_a_fan_out_and_a_join_and_translates() -> None:
    dags = dag_bag(BENCH / "bridge_dag_dags")
    translation = translate(dags["eo_bench_fanout"])
    assert translation.ok, translation.report()
    assert translation.spec is not None
    tasks = {t.task_id: t for t in translation.spec.tasks}
    assert len(tasks) == 20
    fanned = [t for t in tasks.values() if t.upstream == ("extract",)]
    assert len(fanned) == 8
    assert tasks["join"].upstream == tuple(f"check_{i}" for i in range(8))
    # the driver hands the same graph over
    assert [t.task_id for t in dags["eo_bench_fanout_driver"].tasks] == ["run_in_temporal"]


@pytest.mark.extended
@pytest.mark.timeout(600)
def test_the_whole_dag_bench_runs_each_kind_and_prints_one_json_line_last(
    temporal_address: str,
) -> None:
    figures = run_bench(
        BENCH / "bridge_overhead.py",
        "--whole-dag", "--reps", "1", "--address", temporal_address,
        "--port-base", str(free_port_block()),
        timeout=540,
    )  # fmt: skip
    assert figures["tasks"] == 20
    for kind in ("airflow", "bridge", "driver"):
        assert len(figures["makespan_s"][kind]) == 1
        assert figures["makespan_s"][kind][0] > 0
    assert set(figures["driver_split_median_s"]) == {"to_handover", "in_temporal", "to_run_end"}
