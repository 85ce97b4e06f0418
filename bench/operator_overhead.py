"""What the plugin costs a task, measured on a real Airflow 3.3 stack in one run.

    .venv/bin/python bench/operator_overhead.py [--tasks 500] [--batch 50] [--parallelism 8]
                                                [--pgbouncer | --agent] [--profile DIR]
                                                [--executor local|celery]

One Airflow stack on fresh databases runs batches of the same mapped no-op task, protected and
with the plugin switched off, alternating, and prints side by side the time the plugin adds
inside a task, each task process's CPU, the lease store's CPU per try and the throughput ratio
two ways (batch makespans, and each task's cycle on its executor slot) with 95% intervals.
Progress goes to stderr; the last line of stdout is one JSON object. What each figure means,
the options and the figures: docs/benchmarks.md, "Operator overhead".
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from airflow_plugins.demo.airflow_api import AirflowApi
from airflow_plugins.demo.celery_workers import WORKERS, CeleryConfig
from airflow_plugins.demo.deployment import (
    LEASE_CONN_ID,
    airflow_uri,
    create_database,
    drop_database,
)
from airflow_plugins.demo.stack import ADMIN_USER, AirflowStack, wait_until
from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore, migrate
from airflow_plugins.lease.agent_client import AgentClient

DAGS = Path(__file__).resolve().parent / "operator_overhead_dags"
PROTECTED, PLAIN = "eo_bench_protected", "eo_bench_plain"
TARGETS = {"added_p50_ms": 10.0, "added_p99_ms": 50.0, "throughput_ratio": 0.97}
# t quantiles (two-sided 95%) for small samples; larger ones use 1.96
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
T95.update({10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04})


def say(message: str) -> None:
    """Progress, on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def t_quantile(df: int) -> float:
    """The two-sided 95% t quantile for ``df`` degrees of freedom (conservative step table)."""
    return next((T95[k] for k in sorted(T95) if k >= df), 1.96)


def _ts(value: str | None) -> datetime:
    if not value:
        raise ValueError("a finished task instance without a timestamp")
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class PgBouncer:
    """A PgBouncer in transaction mode in front of one database (for ``--pgbouncer``)."""

    def __init__(self, dsn: str, port: int) -> None:
        self.target = psycopg.conninfo.conninfo_to_dict(dsn)
        self.port = port
        self.folder = Path(tempfile.mkdtemp(prefix="eo-bench-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """The pooled DSN (same database name, the pooler's port)."""
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=self.port, user="postgres", dbname=str(self.target["dbname"])
        )

    def start(self) -> None:
        """Writes the config and starts the pooler; waits until it answers."""
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        t = self.target
        ini = self.folder / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"{t['dbname']} = host={t.get('host', '127.0.0.1')} port={t.get('port', 5432)} "
            f"dbname={t['dbname']} user={t.get('user', 'postgres')}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\nmax_client_conn = 500\n"
            "default_pool_size = 8\nserver_reset_query =\nignore_startup_parameters = "
            "options,extra_float_digits\n"
            f"logfile = {self.folder / 'pgbouncer.log'}\n"
        )
        self.folder.chmod(0o777)
        ini.chmod(0o644)
        argv = [binary, str(ini)]
        if os.geteuid() == 0:  # it refuses to run as root: the embedded server's user
            from airflow_plugins.demo.embedded_postgres import _service_user

            user = _service_user()
            argv[1:1] = ["-u", user.pw_name if user else "nobody"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self._answers, timeout=30, what="pgbouncer")

    def _answers(self) -> bool:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def stop(self) -> None:
        """Stops the pooler (by its pid) and removes its folder."""
        stop_helper(self.proc, self.folder)


class Agent:
    """A lease agent (``runlease agent``) for one store (for ``--agent``)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.folder = Path(tempfile.mkdtemp(prefix="eo-bench-agent-"))
        self.socket = str(self.folder / "agent.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Starts the agent; waits until it answers for the store."""
        runlease = Path(sys.executable).with_name("runlease")
        with (self.folder / "agent.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [str(runlease), "--dsn", self.dsn, "agent", "--socket", self.socket],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        probe = AgentClient(self.socket, self.dsn, timeout=10)
        wait_until(probe.ping, timeout=30, what="lease agent")

    def stop(self) -> None:
        """Stops the agent (by its pid) and removes its folder."""
        stop_helper(self.proc, self.folder)


def stop_helper(proc: subprocess.Popen[bytes] | None, folder: Path) -> None:
    """Stops a helper process the bench started (SIGTERM, SIGKILL after 10 s) by its pid,
    and removes its folder."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(folder, ignore_errors=True)


class Bench:
    """One stack, two DAGs, alternating batches."""

    def __init__(
        self,
        admin_dsn: str,
        tasks: int,
        batch: int,
        port_base: int,
        *,
        pgbouncer: bool = False,
        agent: bool = False,
        parallelism: int = 8,
        schedulers: int = 1,
        min_heartbeat_interval: int = 1,
        profile_dir: str | None = None,
        executor: str = "local",
        core_parallelism: int | None = None,
    ) -> None:
        self.admin_dsn = admin_dsn
        self.executor = executor
        # CeleryExecutor: two workers sharing the slots; the scheduler may send twice as many
        # tasks as there are slots, so a freed slot's next task already waits at the broker
        # (a LocalExecutor slot's next task waits in the executor's own queue): a slot's cycle
        # is then the task's, not the scheduler's loop seeing the end through the result backend
        self.celery = (
            CeleryConfig(workers=WORKERS, concurrency=math.ceil(parallelism / len(WORKERS)))
            if executor == "celery"
            else None
        )
        self.min_heartbeat_interval = min_heartbeat_interval
        # a gap on a slot longer than this holds a supervisor exit wait (normal gaps: < 0.1 s)
        self.stall_s = max(0.5, min_heartbeat_interval / 2)
        self.schedulers = schedulers
        self.parallelism = parallelism
        self._core_parallelism = core_parallelism
        self.profile_dir = profile_dir
        self.use_pgbouncer = pgbouncer
        self.pooler: PgBouncer | None = None
        self.use_agent = agent
        self.agent: Agent | None = None
        self.batch = batch
        self.pairs = max(2, math.ceil(tasks / batch))
        self.port_base = port_base
        self.metadata_dsn = ""
        self.lease_dsn = ""
        self.stack: AirflowStack | None = None
        self.api: AirflowApi | None = None
        self.timings_dir = Path(tempfile.mkdtemp(prefix="eo-bench-timings-"))
        self._dates = (date.today() - timedelta(days=n) for n in range(1, 10_000))

    def start(self) -> None:
        """Creates the databases and starts the stack."""
        self.metadata_dsn = create_database(self.admin_dsn, "eo_bench_airflow")
        self.lease_dsn = create_database(self.admin_dsn, "eo_bench_leases")
        migrate(self.lease_dsn, LEASE_STORE)
        self.timings_dir.chmod(0o777)  # task processes may run as another user
        task_dsn = self.lease_dsn
        if self.use_pgbouncer:
            self.pooler = PgBouncer(self.lease_dsn, self.port_base + 10)
            self.pooler.start()
            task_dsn = self.pooler.dsn
            say(f"lease store behind PgBouncer on port {self.pooler.port}")
        agent_env = {}
        if self.use_agent:
            self.agent = Agent(self.lease_dsn)
            self.agent.start()
            agent_env["AIRFLOW__EXACTLY_ONCE__AGENT_SOCKET"] = self.agent.socket
            say(f"lease agent on {self.agent.socket}")
        self.stack = AirflowStack(
            self.metadata_dsn,
            dag_folders={"bench": DAGS},
            connections={LEASE_CONN_ID: airflow_uri(task_dsn)},
            extra_env={
                "EO_BENCH_BATCH": str(self.batch),
                "EO_BENCH_TIMINGS": str(self.timings_dir),
                "AIRFLOW__EXACTLY_ONCE__ENABLED": "True",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
                "AIRFLOW__CORE__PARALLELISM": str(self.core_parallelism),
                "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": str(self.min_heartbeat_interval),
            }
            | ({"EO_BENCH_PROFILE": self.profile_dir} if self.profile_dir else {})
            | agent_env,
            port_base=self.port_base,
            schedulers=self.schedulers,
            celery=self.celery,
        )
        last_port = self.port_base + 7 + len(self.stack.workers)
        say(f"starting Airflow ({self.executor} executor) on ports {self.port_base}-{last_port}")
        self.stack.start(timeout=300)
        self.api = AirflowApi(self.stack.base_url, ADMIN_USER, self.stack.passwords[ADMIN_USER])
        for dag_id in (PROTECTED, PLAIN):
            wait_until(
                functools.partial(self.api.is_parsed, dag_id), timeout=300, what=f"DAG {dag_id}"
            )

    @property
    def slots(self) -> int:
        """Tasks that can run at once: LocalExecutor's workers, or the Celery pool processes."""
        if self.celery is None:
            return self.parallelism
        return self.celery.concurrency * len(self.celery.workers)

    @property
    def core_parallelism(self) -> int:
        """``[core] parallelism``: as given, else the slots, twice them on Celery (see
        ``__init__``)."""
        if self._core_parallelism is not None:
            return self._core_parallelism
        return self.parallelism if self.celery is None else 2 * self.slots

    def stop(self) -> None:
        """Stops the stack and drops the databases."""
        if self.api is not None:
            self.api.close()
        if self.stack is not None:
            self.stack.stop()
        if self.pooler is not None:
            self.pooler.stop()
        if self.agent is not None:
            self.agent.stop()
        shutil.rmtree(self.timings_dir, ignore_errors=True)
        for dsn in (self.metadata_dsn, self.lease_dsn):
            if dsn:
                drop_database(self.admin_dsn, dsn)

    def run_batch(self, dag_id: str) -> dict[str, Any]:
        """Runs one batch of ``dag_id`` alone; returns its task instances' timestamps."""
        assert self.api is not None
        day = next(self._dates).isoformat()
        run_id = self.api.trigger_dag_run(dag_id, {"business_date": day})
        run = self.api.wait_for_run_state(dag_id, run_id, timeout=1800)
        tis = [t for t in self.api.task_instances(dag_id, run_id) if t["task_id"] == "noop"]
        bad = [t for t in tis if t["state"] != "success"]
        if run["state"] != "success" or bad or len(tis) != self.batch:
            raise RuntimeError(f"{dag_id} {run_id}: {run['state']}, {len(tis)} tasks, bad {bad}")
        queued = [_ts(t["queued_when"]) for t in tis]
        started = [_ts(t["start_date"]) for t in tis]
        ended = [_ts(t["end_date"]) for t in tis]
        makespan = (max(ended) - min(queued)).total_seconds()
        return {
            "dag_id": dag_id,
            "run_id": run_id,
            "queued_to_done": [(e - q).total_seconds() for q, e in zip(queued, ended, strict=True)],
            "slot": [(e - s).total_seconds() for s, e in zip(started, ended, strict=True)],
            # map index -> (start, end) in epoch seconds, for the per-slot cycles
            "spans": {
                t["map_index"]: (s.timestamp(), e.timestamp())
                for t, s, e in zip(tis, started, ended, strict=True)
            },
            "makespan": makespan,
        }

    def timings(self) -> dict[tuple[str, str], dict[int, dict[str, float]]]:
        """(dag_id, run_id) -> map index -> the task's stopwatch: ``plugin`` (seconds in the
        plugin), ``execute`` (execute minus body), each hook's seconds, and ``slot_pid`` (its
        executor slot: the LocalExecutor worker or Celery pool process its supervisor runs in)."""
        found: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
        for path in self.timings_dir.glob("*.json"):
            row = json.loads(path.read_text())
            dag_id, run_id, map_index = row.pop("dag_id"), row.pop("run_id"), row.pop("map_index")
            parts = {
                k: float(v)
                for k, v in row.items()
                if k.startswith(("on_task_instance", "warm_up"))
                or k in ("execute_cpu", "process_cpu", "slot_pid")
            }
            parts["execute"] = float(row["execute"]) - float(row["body"])
            parts["early_start"] = float(row["early_start"])
            parts["plugin"] = parts["execute"] + float(row["hooks"]) + parts["early_start"]
            found.setdefault((dag_id, run_id), {})[map_index] = parts
        return found

    def server_cpu_per_try(self, tries: int = 200) -> list[float] | None:
        """Milliseconds of lease-store server CPU one protected try costs (the warm-up's
        statements, acquire, complete, and with direct connections its backend's start),
        from the backends' own CPU time (``/proc/<pid>/schedstat``); None when the server is
        not on this host.

        Direct: each try's new backend, read just before the try closes it. Through
        PgBouncer: the pooled backends' CPU and the pooler's, summed before and after each
        try (they outlive it and any of them may serve it). Through the agent: the agent's
        CPU (all its threads) and its backends', the same way."""
        spent: list[float] = []
        holder = Holder.process("eo-bench-server-cpu")
        shared = self.pooler is not None or self.agent is not None
        for n in range(tries):
            store = LeaseStore(
                self.pooler.dsn if self.pooler is not None else self.lease_dsn,
                agent_socket=self.agent.socket if self.agent is not None else None,
            )
            try:
                before = self._pooled_backends_cpu() if shared else 0.0
                row = None
                if not shared:
                    with store.connection() as conn:
                        row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
                store.warm_up()
                got = store.acquire(f"eo-bench/server-cpu/{n}", holder)
                store.complete(got.lease, n)
                if shared:
                    used = self._pooled_backends_cpu() - before
                else:
                    assert row is not None
                    used = _backend_cpu_ms(row["pid"])
            finally:
                store.close()
            if math.isnan(used) or math.isnan(before):
                return None
            spent.append(used)
        return spent

    def _pooled_backends_cpu(self) -> float:
        """The summed CPU milliseconds of the lease store's backends other than this one,
        and of the pooler or the agent itself."""
        owner = self.pooler or self.agent
        helper = owner.proc if owner is not None else None
        assert helper is not None
        with psycopg.connect(self.lease_dsn, autocommit=True) as conn:
            pids = conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        return _backend_cpu_ms(helper.pid, threads=True) + sum(_backend_cpu_ms(p) for (p,) in pids)


def _backend_cpu_ms(pid: int, *, threads: bool = False) -> float:
    """A local process's CPU milliseconds so far (NaN when it is not on this host); with
    ``threads``, of all its threads (``/proc/<pid>/schedstat`` counts the first one only)."""
    try:
        if threads:
            return (
                sum(
                    int(t.joinpath("schedstat").read_text().split()[0])
                    for t in Path(f"/proc/{pid}/task").iterdir()
                )
                / 1e6
            )
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6
    except OSError:
        return math.nan


def spread(
    values: Sequence[float], digits: int = 2, *, mean: bool = False
) -> dict[str, float | None]:
    """p50 and p99 of ``values`` (and their mean), rounded for the JSON line; None for each
    when there are no values."""
    figures = {
        "p50": rounded(percentile(values, 0.5), digits),
        "p99": rounded(percentile(values, 0.99), digits),
    }
    if mean:
        figures["mean"] = rounded(statistics.fmean(values), digits) if values else None
    return figures


def bootstrap_ratio(pairs: Sequence[Sequence[float]], rounds: int = 10_000) -> tuple[float, float]:
    """95% interval of the pooled ratio, resampling pairs of batches.

    Each pair is (protected total, protected count, plain total, plain count); the ratio is
    that of the pooled means, plain over protected (with counts of 1, sum(plain) /
    sum(protected)).
    """
    rng = random.Random(20240215)
    ratios = []
    for _ in range(rounds):
        sample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(pooled_ratio(sample))
    return percentile(ratios, 0.025), percentile(ratios, 0.975)


def pooled_ratio(pairs: Sequence[Sequence[float]]) -> float:
    """plain over protected, pooled over ``pairs`` (see ``bootstrap_ratio``); NaN when a kind
    has nothing counted (no slot ran two tasks of a batch back to back)."""
    counts = sum(p[1] for p in pairs), sum(p[3] for p in pairs)
    if not all(counts):
        return math.nan
    protected = sum(p[0] for p in pairs) / counts[0]
    plain = sum(p[2] for p in pairs) / counts[1]
    return plain / protected


def rounded(value: float, digits: int = 4) -> float | None:
    """``value`` rounded for the JSON line; None for NaN (a figure that could not be taken)."""
    return None if math.isnan(value) else round(value, digits)


def slot_cycles(
    batch: dict[str, Any], tasks: dict[int, dict[str, float]], stall_s: float
) -> tuple[list[float], list[float], int, int]:
    """One batch's cycles on its executor slots: for each task followed by another on the
    same executor slot (LocalExecutor worker, Celery pool process), the time from its start
    to that next start (its own slot time, its process's exit, the supervisor's report, the
    hand-over and the next task's start). Returns the cycles, the idle gaps (next start - this
    end) of those cycles, how many were left out because their gap held Airflow's supervisor
    exit wait (a gap above ``stall_s``; see docs/benchmarks.md), and the slots the batch ran
    on."""
    by_slot: dict[float, list[tuple[float, float]]] = {}
    for index, span in batch["spans"].items():
        by_slot.setdefault(tasks[index]["slot_pid"], []).append(span)
    cycles: list[float] = []
    gaps: list[float] = []
    stalls = 0
    for spans in by_slot.values():
        spans.sort()
        for (start, end), (next_start, _) in itertools.pairwise(spans):
            if next_start - end > stall_s:
                stalls += 1
            else:
                cycles.append(next_start - start)
                gaps.append(next_start - end)
    return cycles, gaps, stalls, len(by_slot)


def summarise(
    bench: Bench, batches: list[dict[str, Any]], warmup: int, server_cpu: list[float] | None
) -> dict[str, Any]:
    """Every figure of the run (warm-up batches excluded)."""
    counted = batches[2 * warmup :]
    inside = bench.timings()
    by_kind: dict[str, dict[str, list[float]]] = {
        d: {"plugin_ms": [], "queued_to_done_s": [], "slot_s": [], "process_cpu_ms": []}
        for d in (PROTECTED, PLAIN)
    }
    parts_ms: dict[str, list[float]] = {}
    cycles: dict[str, dict[str, Any]] = {
        d: {"cycles": [], "gaps": [], "stalls": 0, "per_batch": [], "slots": []}
        for d in (PROTECTED, PLAIN)
    }
    for b in counted:
        by_index = inside.get((b["dag_id"], b["run_id"]), {})
        tasks = list(by_index.values())
        if len(tasks) != bench.batch:
            raise RuntimeError(f"{b['run_id']}: {len(tasks)} timing rows for {bench.batch} tasks")
        batch_cycles, gaps, stalls, slots = slot_cycles(b, by_index, bench.stall_s)
        kind = cycles[b["dag_id"]]
        kind["slots"].append(slots)
        kind["cycles"].extend(batch_cycles)
        kind["gaps"].extend(gaps)
        kind["stalls"] += stalls
        kind["per_batch"].append((sum(batch_cycles), len(batch_cycles)))
        by_kind[b["dag_id"]]["plugin_ms"].extend(t["plugin"] * 1000 for t in tasks)
        by_kind[b["dag_id"]]["process_cpu_ms"].extend(
            t.get("process_cpu", math.nan) * 1000 for t in tasks
        )
        by_kind[b["dag_id"]]["queued_to_done_s"].extend(b["queued_to_done"])
        by_kind[b["dag_id"]]["slot_s"].extend(b["slot"])
        if b["dag_id"] == PROTECTED:
            for t in tasks:
                for part, seconds in t.items():
                    if part not in ("slot_pid", "process_cpu"):  # reported on their own
                        parts_ms.setdefault(part, []).append(seconds * 1000)
    # (protected total, count, plain total, count) per pair of batches: makespans, slot times
    pairs: list[tuple[float, int, float, int]] = []
    slot_pairs: list[tuple[float, int, float, int]] = []
    for i in range(0, len(counted), 2):
        one, two = counted[i], counted[i + 1]
        prot, plain = (one, two) if one["dag_id"] == PROTECTED else (two, one)
        pairs.append((prot["makespan"], 1, plain["makespan"], 1))
        slot_pairs.append((sum(prot["slot"]), 1, sum(plain["slot"]), 1))
    ratio = pooled_ratio(pairs)
    slot_ratio = pooled_ratio(slot_pairs)
    cycle_pairs = [
        (*prot, *plain)
        for prot, plain in zip(
            cycles[PROTECTED]["per_batch"], cycles[PLAIN]["per_batch"], strict=True
        )
    ]
    cycle_ratio = pooled_ratio(cycle_pairs)
    # no interval for a ratio that could not be taken (a kind without a counted cycle)
    cycle_low, cycle_high = (
        (math.nan, math.nan) if math.isnan(cycle_ratio) else bootstrap_ratio(cycle_pairs)
    )
    low, high = bootstrap_ratio(pairs)
    per_pair = [p / q for q, _, p, _ in pairs]
    mean = statistics.fmean(per_pair)
    half = t_quantile(len(per_pair) - 1) * statistics.stdev(per_pair) / math.sqrt(len(per_pair))
    added = by_kind[PROTECTED]["plugin_ms"]
    figures: dict[str, Any] = {
        "lease_store_via": "pgbouncer (transaction mode)"
        if bench.use_pgbouncer
        else "lease agent"
        if bench.use_agent
        else "direct",
        "executor": bench.executor,
        "celery_workers": None
        if bench.celery is None
        else {"workers": len(bench.celery.workers), "slots_each": bench.celery.concurrency},
        "tasks_per_kind": len(added),
        "parallelism": bench.parallelism,
        "core_parallelism": bench.core_parallelism,
        "schedulers": bench.schedulers,
        "batch": bench.batch,
        "pairs": len(pairs),
        "added_in_task_ms": spread(added) | {"max": round(max(added), 2)},
        "added_in_task_cpu_ms": spread(parts_ms.get("execute_cpu", [math.nan])),
        "added_in_task_parts_ms_p50": {
            part: round(percentile(v, 0.5), 2) for part, v in sorted(parts_ms.items())
        },
        # the lease store's warm-up, on its own thread before execute (not in the figures above
        # except for any part execute had to wait for)
        "warm_up_overlapped_ms": spread(parts_ms.get("warm_up", [math.nan]))
        | {
            "thread_cpu_p50": round(percentile(parts_ms.get("warm_up_cpu", [math.nan]), 0.5), 2),
            "tasks_warmed": len(parts_ms.get("warm_up", [])),
            "tasks_execute_waited": sum(
                1 for v in parts_ms.get("warm_up_after_execute_start", []) if v > 0
            ),
        },
        "plain_plugin_in_task_ms": spread(by_kind[PLAIN]["plugin_ms"], 3),
        # each task process's whole CPU from its fork to the end of execute
        "task_process_cpu_ms": {
            kind: spread(v["process_cpu_ms"], 1, mean=True)
            for kind, v in (("protected", by_kind[PROTECTED]), ("plain", by_kind[PLAIN]))
        },
        "queued_to_done_s": {
            kind: spread(v["queued_to_done_s"], 3)
            for kind, v in (("protected", by_kind[PROTECTED]), ("plain", by_kind[PLAIN]))
        },
        "throughput_tasks_per_s": {
            "protected": round(bench.batch * len(pairs) / sum(q for q, _, _, _ in pairs), 3),
            "plain": round(bench.batch * len(pairs) / sum(p for _, _, p, _ in pairs), 3),
        },
        "slot_s": {
            kind: spread(v["slot_s"], 4, mean=True)
            for kind, v in (("protected", by_kind[PROTECTED]), ("plain", by_kind[PLAIN]))
        },
        # the tasks' own slot time only (start_date to end_date)
        "slot_time_ratio": round(slot_ratio, 4),
        "slot_time_ratio_ci95_bootstrap": [round(v, 4) for v in bootstrap_ratio(slot_pairs)],
        "slot_time_added_ms_mean": round(
            1000
            * (
                statistics.fmean(by_kind[PROTECTED]["slot_s"])
                - statistics.fmean(by_kind[PLAIN]["slot_s"])
            ),
            2,
        ),
        # each task's whole cycle on its executor slot (see slot_cycles), without Airflow's
        # supervisor exit waits; those are counted per kind
        "slot_cycle_ms": {
            kind: spread([c * 1000 for c in cycles[d]["cycles"]], 1, mean=True)
            | {
                "idle_gap_p50": rounded(percentile(cycles[d]["gaps"], 0.5) * 1000, 1),
                "cycles": len(cycles[d]["cycles"]),
                "supervisor_exit_waits": cycles[d]["stalls"],
                "slots_per_batch_max": max(cycles[d]["slots"]),
            }
            for kind, d in (("protected", PROTECTED), ("plain", PLAIN))
        },
        "supervisor_exit_wait_s": bench.min_heartbeat_interval,
        "slot_cycle_ratio": rounded(cycle_ratio),
        "slot_cycle_ratio_ci95_bootstrap": [rounded(cycle_low), rounded(cycle_high)],
        "lease_store_server_cpu_ms": None if server_cpu is None else spread(server_cpu, mean=True),
        "throughput_ratio": round(ratio, 4),
        "throughput_ratio_ci95_bootstrap": [round(low, 4), round(high, 4)],
        "throughput_ratio_per_pair_mean_ci95_t": [round(mean - half, 4), round(mean + half, 4)],
        "targets": TARGETS,
    }
    figures["meets_targets"] = {
        "added_p50": figures["added_in_task_ms"]["p50"] <= TARGETS["added_p50_ms"],
        "added_p99": figures["added_in_task_ms"]["p99"] <= TARGETS["added_p99_ms"],
        # each ratio: its point estimate and its interval's low end
        "throughput_ratio": ratio >= TARGETS["throughput_ratio"],
        "throughput_ratio_ci95_low": low >= TARGETS["throughput_ratio"],
        "slot_cycle_ratio": None
        if math.isnan(cycle_ratio)
        else cycle_ratio >= TARGETS["throughput_ratio"],
        "slot_cycle_ratio_ci95_low": None
        if math.isnan(cycle_low)
        else cycle_low >= TARGETS["throughput_ratio"],
    }
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the bench; prints the figures (last line: one JSON object)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=500, help="tasks of each kind (>= 500)")
    parser.add_argument("--batch", type=int, default=50, help="tasks per DAG run")
    parser.add_argument("--warmup-pairs", type=int, default=1, help="uncounted pairs first")
    parser.add_argument("--port-base", type=int, default=26100, help="first of 8 ports")
    parser.add_argument(
        "--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres", help="server"
    )
    via = parser.add_mutually_exclusive_group()
    via.add_argument(
        "--pgbouncer", action="store_true", help="tasks reach the lease store through PgBouncer"
    )
    via.add_argument(
        "--agent", action="store_true", help="tasks send lease statements to a lease agent"
    )
    parser.add_argument(
        "--parallelism",
        type=int,
        default=8,
        help="tasks running at once: LocalExecutor's workers ([core] parallelism), or the "
        "Celery workers' slots together",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "celery"),
        default="local",
        help="LocalExecutor, or CeleryExecutor: two `airflow celery worker` processes sharing "
        "--parallelism slots, the machine's Redis as broker, the metadata database as result "
        "backend",
    )
    parser.add_argument(
        "--core-parallelism",
        type=int,
        help="[core] parallelism, the tasks the scheduler may have queued or running (default: "
        "--parallelism; on Celery twice it, so tasks wait at the broker for a freed slot)",
    )
    parser.add_argument(
        "--schedulers", type=int, choices=(1, 2), default=1, help="schedulers to start"
    )
    parser.add_argument(
        "--min-heartbeat-interval",
        type=int,
        default=1,
        help="[workers] min_heartbeat_interval, the longest a supervisor can miss its task "
        "process's exit (Airflow's default: 5)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="write a cProfile of each protected task's execute to DIR (slows the tasks: "
        "for finding costs, not for the figures)",
    )
    args = parser.parse_args(argv)
    batch = max(1, min(args.batch, args.tasks // 2))  # at least two pairs
    bench = Bench(
        args.admin_dsn,
        args.tasks,
        batch,
        args.port_base,
        pgbouncer=args.pgbouncer,
        agent=args.agent,
        parallelism=args.parallelism,
        schedulers=args.schedulers,
        min_heartbeat_interval=args.min_heartbeat_interval,
        profile_dir=os.path.abspath(args.profile) if args.profile else None,
        executor=args.executor,
        core_parallelism=args.core_parallelism,
    )
    # SIGTERM ends the run through the finally below, which stops the stack it started
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    try:
        bench.start()
        batches: list[dict[str, Any]] = []
        for n in range(args.warmup_pairs + bench.pairs):
            order = (PROTECTED, PLAIN) if n % 2 == 0 else (PLAIN, PROTECTED)
            for dag_id in order:
                batches.append(bench.run_batch(dag_id))
                say(
                    f"pair {n + 1}/{args.warmup_pairs + bench.pairs} {dag_id}: {batch} tasks "
                    f"in {batches[-1]['makespan']:.1f}s"
                    + (" (warm-up)" if n < args.warmup_pairs else "")
                )
        say("lease-store server CPU of a protected try (200 tries, Airflow idle)")
        figures = summarise(bench, batches, args.warmup_pairs, bench.server_cpu_per_try())
    finally:
        bench.stop()
    figures["wall_s"] = round(time.monotonic() - started, 1)
    print(
        f"added in task (lease + hooks): p50 {figures['added_in_task_ms']['p50']} ms, "
        f"p99 {figures['added_in_task_ms']['p99']} ms"
    )
    print(
        f"queued->done p50: protected {figures['queued_to_done_s']['protected']['p50']} s, "
        f"plain {figures['queued_to_done_s']['plain']['p50']} s"
    )
    print(
        f"throughput ratio {figures['throughput_ratio']} "
        f"(95% CI {figures['throughput_ratio_ci95_bootstrap']}); slot-cycle ratio "
        f"{figures['slot_cycle_ratio']} (95% CI {figures['slot_cycle_ratio_ci95_bootstrap']})"
    )
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
