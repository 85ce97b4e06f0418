"""The whole-DAG measure of ``bench/bridge_overhead.py --whole-dag``: one 20-task DAG's makespan,
run by Airflow and through the bridge, side by side in one run.

One Airflow 3.3 stack (LocalExecutor, one scheduler, dag-processor, api-server, triggerer; fresh
metadata and lease-store databases), one Temporal dev server and one bridge worker process
(``python -m bridge.worker``, its DAG folder the bench's) run ``bench/bridge_dag_dags``'s
``eo_bench_fanout`` (fan-out of 8, a join, 20 ordinary TaskFlow tasks with XComs) three ways,
alternating, a fresh business date each time:

* ``airflow``: the DAG triggered in Airflow (REST API), its tasks run by LocalExecutor;
* ``bridge``: the same DAG translated and handed over with ``Handover.start_or_attach``, its
  tasks run as activities by the bridge worker;
* ``driver``: ``eo_bench_fanout_driver`` triggered in Airflow: its ``BridgeOperator`` hands the
  run of the graph over and waits deferred (what a team's cut-over DAG pays end to end).

A makespan runs from the request (the bench's clock before the trigger or handover call) to the
end the engine records (the DAG run's ``end_date``; the workflow's close time). Airflow and the
worker get the same slots (``--slots``: ``[core] parallelism``, the worker lane's activity slots).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client

from airflow_plugins.demo.airflow_api import AirflowApi
from airflow_plugins.demo.deployment import LEASE_CONN_ID, airflow_uri
from airflow_plugins.demo.stack import ADMIN_USER, AirflowStack, wait_until
from airflow_plugins.lease import LeaseStore
from bridge.cutover import ModeStore
from bridge.identity import workflow_id
from bridge.temporal.handover import Handover, run_handle

REPO = Path(__file__).resolve().parents[1]
DAGS = Path(__file__).resolve().parent / "bridge_dag_dags"
GRAPH, DRIVER = "eo_bench_fanout", "eo_bench_fanout_driver"
QUEUE_PREFIX = "eo-bench-dag"  # the bench DAG file's BRIDGE_QUEUE_PREFIX
KINDS = ("airflow", "bridge", "driver")


def say(message: str) -> None:
    """Progress, on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class WholeDag:
    """The stack, the worker, and one timed run of each kind."""

    def __init__(
        self, address: str, lease_dsn: str, metadata_dsn: str, slots: int, port_base: int
    ) -> None:
        self.address = address
        self.lease_dsn = lease_dsn
        self.slots = slots
        self.folder = Path(tempfile.mkdtemp(prefix="eo-bench-dag-"))
        self.stack = AirflowStack(
            metadata_dsn,
            dag_folders={"bench_dag": DAGS},
            connections={LEASE_CONN_ID: airflow_uri(lease_dsn)},
            extra_env={
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
                "AIRFLOW__CORE__PARALLELISM": str(slots),
                "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(slots),
                "BRIDGE_TEMPORAL_ADDR": address,
                "BRIDGE_QUEUE_PREFIX": QUEUE_PREFIX,
                "BRIDGE_LEASE_DSN": lease_dsn,
            },
            port_base=port_base,
            schedulers=1,
        )
        self.api: AirflowApi | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.driver_parts: dict[str, list[float]] = {}
        self._dates = (date.today() - timedelta(days=n) for n in range(1, 10_000))

    def start(self) -> None:
        """Starts Airflow and the worker; sets the graph's cutover mode to ``temporal``."""
        say(f"starting Airflow (LocalExecutor, {self.slots} slots) on {self.stack.port_base}+")
        self.stack.start(timeout=300)
        self.api = AirflowApi(self.stack.base_url, ADMIN_USER, self.stack.passwords[ADMIN_USER])
        for dag_id in (GRAPH, DRIVER):
            wait_until(functools.partial(self.api.is_parsed, dag_id), timeout=300, what=dag_id)
        with LeaseStore(self.lease_dsn) as store:
            ModeStore(store).set(GRAPH, "temporal", actor="bench", reason="bench", force=True)
        log = (self.folder / "worker.log").open("ab")
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "bridge.worker"],
            cwd=REPO,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
                "BRIDGE_TEMPORAL_ADDR": self.address,
                "BRIDGE_QUEUE_PREFIX": QUEUE_PREFIX,
                "BRIDGE_LANES": f"default:{self.slots}",
                "BRIDGE_LEASE_DSN": self.lease_dsn,
                "BRIDGE_DAGS_FOLDER": str(DAGS),
                "BRIDGE_MIGRATE_AT_START": "0",
                "AIRFLOW_HOME": str(self.folder),
                "PYTHONPATH": os.pathsep.join([str(REPO), str(DAGS)]),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._worker_ready, timeout=120, what="the bridge worker")

    def _worker_ready(self) -> bool:
        if self.worker is not None and self.worker.poll() is not None:
            raise RuntimeError(f"the bridge worker exited: {self._worker_log()}")
        return "bridge worker ready" in self._worker_log()

    def _worker_log(self) -> str:
        path = self.folder / "worker.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Stops the worker (SIGTERM to its group, by its pid) and the stack."""
        if self.worker is not None and self.worker.poll() is None:
            os.killpg(self.worker.pid, signal.SIGTERM)
            try:
                self.worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.worker.pid, signal.SIGKILL)
        if self.api is not None:
            self.api.close()
        self.stack.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def in_airflow(self, dag_id: str) -> float:
        """Triggers ``dag_id`` for a fresh business date; its makespan in seconds."""
        assert self.api is not None
        day = next(self._dates).isoformat()
        started = datetime.now(UTC)
        run_id = self.api.trigger_dag_run(dag_id, {"business_date": day})
        run = self.api.wait_for_run_state(dag_id, run_id, timeout=600)
        if run["state"] != "success":
            raise RuntimeError(f"{dag_id} {run_id} ended {run['state']}")
        ended = _ts(run["end_date"])
        if dag_id == DRIVER:
            self._split_driver(day, started, ended)
        return (ended - started).total_seconds()

    def _split_driver(self, day: str, started: datetime, ended: datetime) -> None:
        """Where a driver run's time goes: before the workflow starts (Airflow schedules the
        task, its process starts, translates, hands over), in Temporal, and after it closes
        (the trigger sees the end, the task resumes in a new process, the run ends)."""

        async def times() -> tuple[datetime, datetime]:
            client = await Client.connect(self.address)
            found = await client.get_workflow_handle(workflow_id(GRAPH, day)).describe()
            assert found.close_time is not None
            return found.start_time, found.close_time

        opened, closed = asyncio.run(times())
        for part, (a, b) in {
            "to_handover": (started, opened),
            "in_temporal": (opened, closed),
            "to_run_end": (closed, ended),
        }.items():
            self.driver_parts.setdefault(part, []).append((b - a).total_seconds())

    def in_bridge(self, spec: Any) -> float:
        """Hands a fresh business run of the graph over; its makespan in seconds."""
        day = next(self._dates).isoformat()

        async def run() -> float:
            client = await Client.connect(self.address)
            with LeaseStore(self.lease_dsn) as store:
                handover = Handover(client, f"{QUEUE_PREFIX}-default", store=store)
                started = datetime.now(UTC)
                got = await handover.start_or_attach(spec, day, source="bench")
            handle = run_handle(client, got.workflow_id)
            result = await handle.result()
            if result.status != "success":
                raise RuntimeError(f"{got.workflow_id} ended {result.status}")
            closed = (await handle.describe()).close_time
            assert closed is not None
            return (closed - started).total_seconds()

        return asyncio.run(run())


def graph_spec() -> Any:
    """The graph's translation, as the driver makes it."""
    from airflow.dag_processing.dagbag import DagBag

    from bridge.in_airflow.translate import translate

    dag = DagBag(str(DAGS), safe_mode=False).dags[GRAPH]
    spec = translate(dag).spec
    if spec is None:
        raise RuntimeError(f"{GRAPH} does not translate")
    return spec


def measure(
    address: str, lease_dsn: str, metadata_dsn: str, *, reps: int, slots: int, port_base: int
) -> dict[str, Any]:
    """Runs one warm-up and ``reps`` timed rounds of each kind (order rotating); the figures."""
    bench = WholeDag(address, lease_dsn, metadata_dsn, slots, port_base)
    spec = graph_spec()
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        bench.start()
        runs = {
            "airflow": lambda: bench.in_airflow(GRAPH),
            "bridge": lambda: bench.in_bridge(spec),
            "driver": lambda: bench.in_airflow(DRIVER),
        }
        for r in range(reps + 1):
            order = KINDS[r % 3 :] + KINDS[: r % 3]
            for kind in order:
                took = runs[kind]()
                say(f"round {r}{' (warm-up)' if r == 0 else ''} {kind}: {took:.2f} s")
                if r:
                    times[kind].append(took)
    finally:
        bench.stop()
    medians = {k: round(statistics.median(v), 3) for k, v in times.items()}
    return {
        "tasks": len(spec.tasks),
        "slots": slots,
        "reps": reps,
        "makespan_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "median_s": medians,
        "ratio_bridge_airflow": round(medians["bridge"] / medians["airflow"], 3),
        "ratio_driver_airflow": round(medians["driver"] / medians["airflow"], 3),
        # the timed driver runs' medians (the warm-up's split is the first, left out)
        "driver_split_median_s": {
            part: round(statistics.median(v[1:]), 3) for part, v in bench.driver_parts.items()
        },
        "load_1m_at_end": round(os.getloadavg()[0], 2),
    }


def report(figures: dict[str, Any]) -> None:
    """Prints the figures (the JSON line last)."""
    med = figures["median_s"]
    for kind in KINDS:
        spread = figures["makespan_s"][kind]
        low, high = min(spread), max(spread)
        print(f"{kind:8s} median {med[kind]:7.2f} s  (min {low:.2f}, max {high:.2f})")
    print(
        f"bridge/airflow {figures['ratio_bridge_airflow']}  driver/airflow "
        f"{figures['ratio_driver_airflow']} (target <= 1: no slower than Airflow's own run)"
    )
    split = ", ".join(f"{k} {v:.2f} s" for k, v in figures["driver_split_median_s"].items())
    print(f"driver's median split: {split}")
    figures["targets_met"] = figures["ratio_bridge_airflow"] <= 1
    print(json.dumps(figures), flush=True)
