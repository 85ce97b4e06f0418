"""The no-op operator of ``bench/operator_overhead.py`` and its in-task stopwatch.

Not a DAG file: the two bench DAGs (``eo_bench_protected``, ``eo_bench_plain``) import it. It
times, inside each task process, what the plugin does there: ``execute`` minus the body
(``ExactlyOnceBenchNoop.execute``), the plugin's listener hooks (``_timed_guarded``), starting
the early acquire (``_timed_start_early``) and, apart, the lease store's warm-up
(``_timed_warm``); ``_record`` hands the figures to the bench.
"""

from __future__ import annotations

import cProfile
import json
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection import connection_warmup, listener, protected_try
from airflow_plugins.protection.operators import ExactlyOnceOperator

TIMINGS: dict[str, float] = {"execute": 0.0, "body": 0.0, "hooks": 0.0, "early_start": 0.0}
_WARM: dict[str, float] = {}
_unwrapped_guarded = listener._guarded
_unwrapped_warm = connection_warmup._warm


def _record(ti: Any) -> None:
    """Writes this try's timings as one JSON line to a file of its own in ``EO_BENCH_TIMINGS``.

    Called at the end of ``execute``, after the stopwatch; both kinds pay that write alike. A
    file, not a database row: a task process's first Postgres connection costs more than its
    later ones, and only the protected kind would have had one already.
    """
    row = {"dag_id": ti.dag_id, "run_id": ti.run_id, "map_index": ti.map_index, **TIMINGS}
    path = os.path.join(os.environ["EO_BENCH_TIMINGS"], f"{uuid.uuid4().hex}.json")
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")


def _timed_guarded(what: str, action: Callable[[], None]) -> None:
    """``hooks``: every listener hook of the plugin that fires in the task process.

    Each goes through ``listener._guarded``, which this wraps. A successful try fires none
    after ``execute``: the listener writes only failed and skipped tries.
    """
    started = time.perf_counter()
    try:
        _unwrapped_guarded(what, action)
    finally:
        spent = time.perf_counter() - started
        TIMINGS["hooks"] += spent
        TIMINGS[what] = TIMINGS.get(what, 0.0) + spent


listener._guarded = _timed_guarded


def _timed_warm(conn_id: str | None) -> None:
    """``warm_up``, reported apart from the plugin's time: the lease store's warm-up.

    It runs on its own thread while Airflow still prepares the task: its wall and thread CPU
    time, and how long ``execute`` started before it finished (that wait is inside
    ``execute``, so already counted).
    """
    profile_dir = os.environ.get("EO_BENCH_PROFILE")
    profiler = cProfile.Profile() if profile_dir else None
    _WARM["started"], cpu = time.perf_counter(), time.thread_time()
    try:
        if profiler is not None:
            profiler.enable()
        _unwrapped_warm(conn_id)
    finally:
        if profiler is not None:
            profiler.disable()
        _WARM["cpu"] = time.thread_time() - cpu
        _WARM["ended"] = time.perf_counter()
        if profiler is not None and profile_dir:
            profiler.dump_stats(os.path.join(profile_dir, f"warm-{os.getpid()}.pstats"))


connection_warmup._warm = _timed_warm
_unwrapped_start_early = protected_try.start_early


def _timed_start_early(*args: Any, **kwargs: Any) -> bool:
    """``early_start``: starting the try's acquire once the templates are rendered.

    The acquire itself runs on its own thread beside Airflow's preparation; what ``execute``
    still waits for it is in ``execute``.
    """
    started = time.perf_counter()
    try:
        return _unwrapped_start_early(*args, **kwargs)
    finally:
        TIMINGS["early_start"] += time.perf_counter() - started


protected_try.start_early = _timed_start_early


class ExactlyOnceBenchNoop(ExactlyOnceOperator):
    """A protected task whose body does nothing; it times the plugin around the body."""

    def execute(self, context: Any) -> Any:
        """``ExactlyOnceOperator.execute``, timed: key, acquire, keeper, sink-less fence,
        complete, minus the body's own time."""
        profile_dir = os.environ.get("EO_BENCH_PROFILE")
        profiler = cProfile.Profile() if profile_dir else None
        started, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        result = super().execute(context)
        if profiler is not None:
            profiler.disable()
        TIMINGS["execute"] = time.perf_counter() - started
        if "started" in _WARM:
            TIMINGS["warm_up"] = _WARM["ended"] - _WARM["started"]
            TIMINGS["warm_up_cpu"] = _WARM["cpu"]
            TIMINGS["warm_up_after_execute_start"] = max(0.0, _WARM["ended"] - started)
        # CPU of every thread of the task process (pool workers, keeper): what the plugin
        # costs the task's machine, whatever else competes for its cores
        TIMINGS["execute_cpu"] = time.process_time() - cpu
        # the LocalExecutor worker that supervises this task process: its executor slot
        TIMINGS["slot_pid"] = os.getppid()
        # the task process's CPU since its fork (parse, Airflow's start-up, warm-up, execute)
        TIMINGS["process_cpu"] = time.process_time()
        _record(context["ti"])
        if profiler is not None and profile_dir:
            profiler.dump_stats(os.path.join(profile_dir, f"{os.getpid()}.pstats"))
        return result

    def execute_protected(self, fence: Fence, context: Any) -> Any:
        """The no-op body, timed (its time is not the plugin's)."""
        started = time.perf_counter()
        n = self.op_kwargs.get("n")
        TIMINGS["body"] = time.perf_counter() - started
        return n


def noop_dag_tasks(batch: int) -> Any:
    """``batch`` mapped no-op tasks, keyed per item by their ``map_index_template``."""
    return ExactlyOnceBenchNoop.partial(
        task_id="noop",
        map_index_template="{{ n }}",
        retries=0,
    ).expand(op_kwargs=[{"n": f"item-{i:04d}"} for i in range(batch)])
