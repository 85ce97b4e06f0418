"""Bench DAGs of ``bench/bridge_overhead.py --whole-dag``: one 20-task graph, run two ways.

``eo_bench_fanout`` is an ordinary TaskFlow DAG (no protection, XComs between tasks): ``extract``
fans out to 8 ``transform_<i>`` tasks (each 50-190 ms of work), each followed by a light
``check_<i>``; ``join`` takes the 8 checks' XComs, then ``load`` and ``report``: 20 tasks.
Airflow runs it as it is; ``eo_bench_fanout_driver``'s one ``BridgeOperator`` hands a business
run of the same graph to Temporal (the bench also hands it over through the handover API).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from bridge.in_airflow.operator import BridgeOperator

os.environ.setdefault("BRIDGE_QUEUE_PREFIX", "eo-bench-dag")
FANOUT = 8


def work(seconds: float, seed: str) -> str:
    """About ``seconds`` of work: half waiting (I/O), half hashing (CPU)."""
    time.sleep(seconds / 2)
    digest = seed.encode()
    deadline = time.perf_counter() + seconds / 2
    while time.perf_counter() < deadline:
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:12]


with DAG(
    dag_id="eo_bench_fanout",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    max_active_tasks=16,
    tags=["bench"],
) as graph:

    @task
    def extract() -> list[int]:
        """The batch to process."""
        return list(range(100))

    @task
    def load(joined: dict[str, Any]) -> int:
        """Writes the joined result (here: counts it)."""
        return len(joined["parts"])

    @task
    def report(loaded: int) -> str:
        """What downstream sees."""
        return f"{loaded} parts"

    @task
    def join(checks: list[dict[str, Any]]) -> dict[str, Any]:
        """The fan-out's join: every check's XCom."""
        return {"parts": [c["part"] for c in checks], "total": sum(c["sum"] for c in checks)}

    def branch(i: int, rows: Any) -> Any:
        @task(task_id=f"transform_{i}")
        def transform(rows: list[int]) -> dict[str, Any]:
            """One share of the rows, with 50-190 ms of work."""
            share = rows[i::FANOUT]
            return {"part": i, "sum": sum(share), "digest": work(0.05 + 0.02 * i, str(i))}

        @task(task_id=f"check_{i}")
        def check(part: dict[str, Any]) -> dict[str, Any]:
            """A light validation of one share."""
            if len(part["digest"]) != 12:
                raise ValueError(f"part {part['part']} is malformed")
            return part

        return check(transform(rows))

    rows = extract()
    report(load(join([branch(i, rows) for i in range(FANOUT)])))

with DAG(
    dag_id="eo_bench_fanout_driver",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    tags=["bench"],
) as driver:
    BridgeOperator(task_id="run_in_temporal", source_dag=graph, period="day", retries=0)
