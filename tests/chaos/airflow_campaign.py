"""The Airflow-level fault campaign: many short billing runs on a real stack, seeded faults.

One real Airflow 3.3 stack (``tests/harness/airflow_harness.py``: two schedulers on
LocalExecutor, api-server, dag-processor, triggerer, on Postgres; the demo payment processor in
a process of its own), its tasks reaching the lease store and the billing database through the
campaign's proxy (``tests/chaos/proxy.py``: the ``exactly_once_leases`` and ``billing_db``
Connections point at it). Business runs of ``chaos_billing`` (``tests/chaos/dags/``: the
nightly billing charge over a few customers, each charged at the processor and recorded
through the sink's fence) are triggered a few at a time, each on a business date of its own,
a new one as each ends. A seed chooses the faults, their order, their targets (a running
charge whose lease is live preferred) and their timing:

* task faults: the task process SIGKILLed, its supervisor SIGKILLed, both stopped (SIGSTOP,
  then SIGCONT) within the lease and past it (and past Airflow's task heartbeat timeout);
* the scheduler running the charge SIGKILLed, the other one standing by (started again
  ``SCHEDULER_BACK`` s later; at most one down at a time, one per ``SCHEDULER_EVERY`` faults);
* the triggerer SIGKILLed (started again ``TRIGGERER_BACK`` s later), where a charge try waits
  deferred for a lease another try holds;
* operator faults through the REST API: the running task cleared, marked failed (then
  cleared a few seconds later, as an operator re-runs it), a second run of the same business
  date triggered (while the first runs, or after it ended);
* the route to the lease store reset or black-holed for up to ``1.2 x`` the lease; the route
  to the billing database reset; one billing session ended (``pg_terminate_backend``, one
  inside a transaction preferred).

A fault counts as landed when it hit while a lease was live (a task fault: the target held its
key's lease, read while it was stopped; a scheduler kill: the target of its executor did; a
REST or store fault: the run's, or any, lease was live; a triggerer kill: a try waited in it
while a lease was live) or a sink transaction was open (the
billing route's faults). With ``--plain`` the runs are of ``chaos_billing_plain``, the same
charge as the plugin runs it with ``[exactly_once] enabled = False`` (no lease, no fence, no
idempotency key): a task fault lands when the charge was running, a store fault hits the
billing route instead (there is no store to hit).

Then the faults stop, every run is waited for, a fresh holder asks each key's lease (still
held two lease lifetimes later: wedged), and the independent checker
(``tests/chaos/airflow_checker.py``) judges the billing rows, the processor's charges and
Airflow's final states.

    .venv/bin/python -m tests.chaos.airflow_campaign --seed 1 --faults 300
    .venv/bin/python -m tests.chaos.airflow_campaign --seed 1 --faults 60 --plain

The last line is the checker's JSON verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from airflow_plugins.demo.airflow_api import AirflowApiError
from airflow_plugins.demo.deployment import (
    BILLING_CONN_ID,
    BILLING_SCHEMA,
    LEASE_CONN_ID,
    airflow_uri,
)
from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres
from airflow_plugins.demo.stack import SCHEDULERS
from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, Holder, LeaseStore, Outcome, migrate
from airflow_plugins.lease.agent_client import AgentClient
from airflow_plugins.lease.keys import escape_map_key, lease_key
from tests.chaos.airflow_checker import bad
from tests.chaos.lease_campaign import ADMIN_DSN
from tests.chaos.proxy import Proxy
from tests.harness.airflow_harness import AirflowHarness
from tests.harness.celery_harness import CeleryHarness
from tests.harness.fixtures import keep_logs
from tests.lease.agent_process import AgentProcess
from tests.lease.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DAGS = Path(__file__).resolve().parent / "dags"
DAG_ID = "chaos_billing"
PLAIN_DAG_ID = "chaos_billing_plain"  # its twin with the plugin disabled
MAPPED_DAG_ID = "chaos_billing_mapped"  # the charge mapped per tenant (--mapped)
TENANTS = ("north", "south", "east", "west")  # --mapped: the runs' tenants, in map index order
TASK = "charge"
TASK_KINDS = ("task_sigkill", "supervisor_sigkill", "sigstop_within_lease", "sigstop_past_lease")
AIRFLOW_KINDS = (
    "scheduler_sigkill",
    "triggerer_sigkill",
    "clear",
    "mark_failed",
    "duplicate_trigger",
)
ROUTE_KINDS = ("store_reset", "store_blackhole", "sink_reset", "sink_cut")
KINDS = TASK_KINDS + AIRFLOW_KINDS + ROUTE_KINDS
# with --executor celery: the Celery worker running a charge (its whole process tree)
WORKER_KINDS = ("worker_sigkill", "worker_sigstop_past_lease")
# with --agent: the lease agent the tasks reach the store through
AGENT_KINDS = ("agent_sigkill", "agent_sigstop")
# with --private-pg: the lease store's (and billing's) own server, capped per run
SERVER_KINDS = ("store_restart", "store_crash")
TTL = 10.0  # the harness's lease (FAST_LEASES); Airflow's task heartbeat timeout is 20 s
SCHEDULER_BACK = 25.0  # seconds until a killed scheduler is started again
SCHEDULER_EVERY = 12  # at most one scheduler kill per this many faults
TRIGGERER_BACK = 10.0  # seconds until a killed triggerer is started again
WORKER_BACK = 15.0  # seconds until a killed Celery worker is started again
AGENT_BACK = 5.0  # seconds until a killed lease agent is started again
LIVE_LEASES = """
SELECT key, (holder->>'pid')::int FROM runlease.lease
WHERE state = 'running' AND expires_at > now()
"""
RUNNING_TRIES = """
SELECT run_id, id::text, map_index FROM task_instance
WHERE dag_id = %s AND task_id = %s AND state = 'running'
"""
RUN_STATES = "SELECT run_id, state FROM dag_run WHERE dag_id = %s"
# the charge tries waiting in the triggerer (a held lease, an unreachable store)
DEFERRED_TRIES = """
SELECT run_id FROM task_instance WHERE dag_id = %s AND task_id = %s AND state = 'deferred'
"""
SINK_SESSIONS = """
SELECT pid, xact_start IS NOT NULL FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
ORDER BY xact_start IS NULL, pid
"""
CUT = "SELECT pg_terminate_backend(%s)"
TERMINAL = ("success", "failed")


@dataclass(frozen=True)
class RunningCharge:
    """One running try of a run's charge (with --mapped, of one tenant's), and its processes."""

    run_id: str
    business_date: str
    task: int
    supervisor: int
    scheduler: str | None
    item: str  # the checker's run it charges: its business date (with --mapped, its tenant's)
    map_index: int = -1


@dataclass(eq=False)
class Run:
    """One triggered DAG run (a business date's first run, or a duplicate of it)."""

    run_id: str
    business_date: str
    duplicate: bool = False
    state: str = "queued"


@dataclass
class AirflowCampaign:
    """The state of one Airflow campaign run."""

    seed: int
    faults: int
    plain: bool
    airflow: AirflowHarness
    proxy: Proxy
    mapped: bool = False  # runs of chaos_billing_mapped: the charge mapped over ``tenants``
    tenants: tuple[str, ...] = TENANTS
    in_flight: int = 5
    customers: int = 20
    delay: float = 0.4
    gap: tuple[float, float] = (0.5, 1.5)
    kinds: tuple[str, ...] = KINDS
    drain: float = 420.0
    server: EmbeddedPostgres | None = None  # the store's own server (``chaos_stack(private)``)
    server_faults: int = 0  # how many of the faults restart or crash it
    rng: random.Random = field(init=False)
    runs: list[Run] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    stopped: dict[int, float] = field(default_factory=dict)  # pid -> when to resume it
    # mark-failed, then cleared: when, the run, the map index (None: unmapped)
    clears: list[tuple[float, Run, int | None]] = field(default_factory=list)
    scheduler_down: dict[str, float] = field(default_factory=dict)  # name -> when back
    triggerer_back: float = 0.0  # when a killed triggerer is started again (0: it is up)
    worker_down: dict[str, float] = field(default_factory=dict)  # Celery worker -> when back
    agent: LeaseAgent | None = None  # the lease agent of ``chaos_stack(agent=True)``
    agent_back: float = 0.0  # when a killed or stopped agent is back (0: it is up)
    last_scheduler_kill: int = -SCHEDULER_EVERY
    clear_errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.celery = self.airflow if isinstance(self.airflow, CeleryHarness) else None
        known = KINDS + (WORKER_KINDS if self.celery is not None else ())
        known += AGENT_KINDS if self.agent is not None else ()
        unknown = set(self.kinds) - set(known)
        if unknown or not self.kinds:
            raise ValueError(f"unknown fault kinds {sorted(unknown)} on this executor: {known}")
        if self.plain and self.mapped:
            raise ValueError("--mapped runs the plugin's mapped charge: not with --plain")
        self.rng = random.Random(self.seed)
        self.dag_id = PLAIN_DAG_ID if self.plain else MAPPED_DAG_ID if self.mapped else DAG_ID
        self.api = self.airflow.client()
        self.meta = psycopg.connect(self.airflow.metadata_dsn, autocommit=True)
        self.store = psycopg.connect(self.airflow.lease_dsn, autocommit=True)
        self.sink = psycopg.connect(self.airflow.sink_dsn, autocommit=True)
        self.keys: dict[str, str] = {}  # lease key -> the checker's run (``run_keys``)

    def close(self) -> None:
        for conn in (self.meta, self.store, self.sink):
            conn.close()

    # -- runs ---------------------------------------------------------------------------------

    def run_keys(self, business_date: str) -> list[str]:
        """The checker's runs of a business date: the date, or with --mapped one per tenant
        (``date/tenant``: each tenant's charge is a lease of its own, with its own tokens)."""
        if not self.mapped:
            return [business_date]
        return [f"{business_date}/{tenant}" for tenant in self.tenants]

    def trigger(self, business_date: str, *, duplicate: bool = False) -> Run:
        conf: dict[str, Any] = {
            "business_date": business_date,
            "customers": self.customers,
            "charge_delay": self.delay,
        }
        if self.mapped:
            conf["tenants"] = list(self.tenants)
        run_id = f"chaos__{business_date}__{len(self.runs):04d}"
        try:
            _rest(self.api.trigger_dag_run, self.dag_id, conf, run_id=run_id)
        except AirflowApiError as exc:  # a retry of a trigger that got through: 409
            if " 409" not in str(exc):
                raise
        run = Run(run_id, business_date, duplicate)
        self.runs.append(run)
        if self.mapped:
            for tenant, item in zip(self.tenants, self.run_keys(business_date), strict=True):
                key = lease_key(self.dag_id, TASK, business_date, escape_map_key(tenant))
                self.keys[str(key)] = item
        else:
            self.keys[str(lease_key(self.dag_id, TASK, business_date))] = business_date
        return run

    def refresh(self) -> None:
        """Reads every run's state from Airflow's metadata database."""
        states = dict(self.meta.execute(RUN_STATES, (self.dag_id,)).fetchall())
        for run in self.runs:
            run.state = str(states.get(run.run_id, run.state))

    def feed(self) -> None:
        """Keeps ``in_flight`` business dates at work (their first runs)."""
        pending = {run for _, run, _ in self.clears}
        working = [
            r for r in self.runs if not r.duplicate and (r.state not in TERMINAL or r in pending)
        ]
        for _ in range(self.in_flight - len(working)):
            self.trigger(self.airflow.fresh_business_date())

    def tend(self) -> None:
        """Resumes stopped processes, starts killed schedulers again, clears marked tasks,
        when each is due."""
        now = time.monotonic()
        for pid, due in list(self.stopped.items()):
            if now >= due:
                _signal(pid, signal.SIGCONT)
                del self.stopped[pid]
        for name, due in list(self.scheduler_down.items()):
            if now >= due:
                self.airflow.stack.stop_component(name, timeout=5.0)
                self.airflow.start_scheduler(name, wait=False)
                del self.scheduler_down[name]
        if self.triggerer_back and now >= self.triggerer_back:
            self.airflow.stack.stop_component("triggerer", timeout=5.0)
            self.airflow.stack.start_triggerer()
            self.triggerer_back = 0.0
        for name, due in list(self.worker_down.items()):
            if now >= due:
                self.worker_back(name)
        if self.agent is not None and self.agent_back and now >= self.agent_back:
            self.agent.back()
            self.agent_back = 0.0
        for due, run, map_index in list(self.clears):
            if now >= due:
                self.clears.remove((due, run, map_index))
                try:
                    _rest(self.api.clear_task, self.dag_id, run.run_id, TASK, map_index)
                except AirflowApiError as exc:  # kept for whoever explains a run left failed
                    self.clear_errors.append(f"{run.run_id}: {str(exc)[:300]}")

    # -- targets ------------------------------------------------------------------------------

    def live_leases(self) -> dict[str, int]:
        """The checker's run (``run_keys``) -> pid of its live lease's holder."""
        if self.plain:
            return {}
        rows = self.store.execute(LIVE_LEASES).fetchall()
        return {self.keys[k]: int(p) for k, p in rows if k in self.keys}

    def running(self) -> list[RunningCharge]:
        """The charges running now, with their processes (not those stopped by a fault)."""
        rows = self.meta.execute(RUNNING_TRIES, (self.dag_id, TASK)).fetchall()
        tries = {ti: (run, int(index)) for run, ti, index in rows}
        if not tries:
            return []
        dates = {r.run_id: r.business_date for r in self.runs}
        schedulers = {pid: name for name, pid in self.airflow.scheduler_pids().items()}
        found = []
        for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
            cmdline = " ".join(proc.info.get("cmdline") or [])
            if "airflow worker -- " not in cmdline:
                continue
            ti = cmdline.rsplit("airflow worker -- ", 1)[1].split()[0]
            run_id, map_index = tries.get(ti, ("", -1))
            if run_id not in dates or proc.info["pid"] in self.stopped:
                continue
            try:
                owner = next(
                    (schedulers[p.pid] for p in proc.parents() if p.pid in schedulers), None
                )
            except psutil.NoSuchProcess:
                continue
            item = self.run_keys(dates[run_id])[max(map_index, 0)]
            pids = proc.info["pid"], proc.info["ppid"]
            found.append(RunningCharge(run_id, dates[run_id], *pids, owner, item, map_index))
        return found

    def worker_back(self, name: str) -> None:
        """Celery worker ``name`` again: a stopped one resumed, a killed one started again."""
        del self.worker_down[name]
        comp = self.airflow.stack.components.get(name)
        if comp is not None and comp.alive():
            self.airflow.stack._allowed_dead.discard(name)  # it was stopped, not killed
            return
        self.airflow.stack.stop_component(name, timeout=5.0)  # what is left of its tree
        self.airflow.stack.start_worker(name)

    def run_of(self, run_id: str) -> Run:
        return next(r for r in self.runs if r.run_id == run_id)

    # -- faults -------------------------------------------------------------------------------

    def choose(self) -> str:
        kind = self.rng.choice(self.kinds)
        if kind == "scheduler_sigkill" and (
            self.scheduler_down or len(self.log) - self.last_scheduler_kill < SCHEDULER_EVERY
        ):
            kind = "task_sigkill"  # capped: the standby must be up, kills spread over the run
        if kind == "triggerer_sigkill" and self.triggerer_back:
            kind = "task_sigkill"  # one triggerer: it is down until it is started again
        if kind in WORKER_KINDS and self.worker_down:
            kind = "task_sigkill"  # one worker away at a time: the other takes the retries
        if kind in AGENT_KINDS and self.agent_back:
            kind = "task_sigkill"  # one agent: it is away until it is back
        if self.plain and kind.startswith("store_"):
            kind = "sink_reset" if kind == "store_reset" else "sink_cut"  # no store to hit
        return kind

    def duplicate_trigger(
        self,
        entry: dict[str, Any],
        leases: dict[str, int],
        charges: list[RunningCharge],
        pick: float,
        spread: float,
    ) -> bool:
        """Triggers a second run of a business date (a running one mostly, else an ended one);
        landed when the first run's lease was live (plain: its charge was running)."""
        ends = [r for r in self.runs if not r.duplicate]
        active = [r for r in ends if r.state not in TERMINAL]
        group = active if active and pick < 0.8 else ends
        if not group:
            return False
        first = group[int(spread * len(group))]
        items = self.run_keys(first.business_date)
        entry.update(key=items[0], landed=any(item in leases for item in items))
        if self.plain:
            entry["landed"] = any(c.business_date == first.business_date for c in charges)
        entry["run"] = self.trigger(first.business_date, duplicate=True).run_id
        self.log.append(entry)
        return True

    def triggerer_fault(self, entry: dict[str, Any], leases: dict[str, int]) -> bool:
        """SIGKILLs the triggerer (started again ``TRIGGERER_BACK`` s later); landed when a
        charge try waits in it while a lease is live (the held lease it waits for)."""
        waiting = [r for (r,) in self.meta.execute(DEFERRED_TRIES, (self.dag_id, TASK))]
        entry["landed"] = bool(waiting) and bool(leases)
        run = next((r for r in self.runs if r.run_id in waiting), self.runs[-1])
        entry["key"] = self.run_keys(run.business_date)[0]
        self.airflow.stack.signal("triggerer", signal.SIGKILL)
        self.triggerer_back = time.monotonic() + TRIGGERER_BACK
        self.log.append(entry)
        return True

    def inject(self) -> bool:
        """Injects one fault; False when there was nothing to hit (not counted)."""
        kind = self.choose()
        pick, spread = self.rng.random(), self.rng.random()
        if len(self.log) in self.server_at:
            self.restart_server(SERVER_KINDS[int(spread * len(SERVER_KINDS))])
            return True
        leases = self.live_leases()
        charges = self.running()
        held = [c for c in charges if leases.get(c.item) == c.task]
        pool = held or charges
        entry: dict[str, Any] = {"kind": kind, "t": time.time()}
        if kind in ROUTE_KINDS:
            return self.route_fault(kind, entry, leases, spread)
        if kind == "duplicate_trigger":
            return self.duplicate_trigger(entry, leases, charges, pick, spread)
        if kind == "triggerer_sigkill":
            return self.triggerer_fault(entry, leases)
        if kind in AGENT_KINDS:
            return self.agent_fault(kind, entry, leases, charges, spread)
        if kind == "scheduler_sigkill" and self.celery is not None:
            return self.celery_scheduler_fault(entry, leases, charges, spread)
        if kind == "scheduler_sigkill":
            pool = [c for c in pool if c.scheduler is not None]
        if not pool:
            return False
        target = pool[int(pick * len(pool))]
        entry.update(key=target.item, run=target.run_id)
        if kind in TASK_KINDS:
            self.task_fault(kind, target, entry, spread)
        elif kind in WORKER_KINDS:
            if not self.worker_fault(kind, target, entry, spread):
                return False
        else:
            self.airflow_fault(kind, target, entry, leases, spread)
        self.log.append(entry)
        return True

    def airflow_fault(
        self,
        kind: str,
        target: RunningCharge,
        entry: dict[str, Any],
        leases: dict[str, int],
        spread: float,
    ) -> None:
        """The scheduler running ``target`` SIGKILLed, or its task cleared or marked failed
        through the REST API; landed when ``target`` held its key's lease."""
        entry["landed"] = self.plain or leases.get(target.item) == target.task
        if kind == "scheduler_sigkill":
            assert target.scheduler is not None
            entry["scheduler"] = target.scheduler
            self.airflow.kill_scheduler(target.scheduler, signal.SIGKILL)
            self.scheduler_down[target.scheduler] = time.monotonic() + SCHEDULER_BACK
            self.last_scheduler_kill = len(self.log)
            return
        index = target.map_index if target.map_index >= 0 else None  # that tenant's alone
        try:
            if kind == "clear":
                _rest(self.api.clear_task, self.dag_id, target.run_id, TASK, index)
            else:
                _rest(self.api.set_task_state, self.dag_id, target.run_id, TASK, "failed", index)
                # the operator re-runs it a few seconds later
                later = time.monotonic() + 2 + 4 * spread
                self.clears.append((later, self.run_of(target.run_id), index))
        except AirflowApiError as exc:  # it ended meanwhile: the fault did not hit
            entry.update(landed=False, error=str(exc)[:200])

    def task_fault(
        self, kind: str, target: RunningCharge, entry: dict[str, Any], spread: float
    ) -> None:
        _signal(target.task, signal.SIGSTOP)
        _signal(target.supervisor, signal.SIGSTOP)
        # frozen: whether it holds its key's lease is now fixed
        if self.plain:
            entry["landed"] = psutil.pid_exists(target.task)
        else:
            entry["landed"] = self.live_leases().get(target.item) == target.task
        if kind == "task_sigkill":
            _signal(target.task, signal.SIGKILL)
            _signal(target.supervisor, signal.SIGCONT)  # it sees its task die: the try failed
        elif kind == "supervisor_sigkill":
            _signal(target.supervisor, signal.SIGKILL)
            _signal(target.task, signal.SIGCONT)  # orphaned, it may go on writing
        else:
            within = kind == "sigstop_within_lease"
            pause = TTL * (0.2 + 0.4 * spread if within else 1.5 + spread)
            entry["pause_s"] = round(pause, 2)
            for pid in (target.task, target.supervisor):
                self.stopped[pid] = time.monotonic() + pause

    def worker_fault(
        self, kind: str, target: RunningCharge, entry: dict[str, Any], spread: float
    ) -> bool:
        """SIGKILLs (started again ``WORKER_BACK`` s later) or stops past the lease the Celery
        worker running ``target``, with every process of its tree (a worker machine lost, or
        paused); landed when the target held its key's lease, read while it was stopped."""
        assert self.celery is not None
        name = self.celery.worker_running(target.supervisor)
        if name is None:
            return False
        pids = self.celery.signal_worker(name, signal.SIGSTOP)
        entry["worker"] = name
        if self.plain:
            entry["landed"] = psutil.pid_exists(target.task)
        else:
            entry["landed"] = self.live_leases().get(target.item) == target.task
        if kind == "worker_sigkill":
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            self.worker_down[name] = time.monotonic() + WORKER_BACK
        else:
            pause = TTL * (1.5 + spread)
            entry["pause_s"] = round(pause, 2)
            for pid in pids:
                self.stopped[pid] = time.monotonic() + pause
            self.worker_down[name] = time.monotonic() + pause
        return True

    def fault_key(self, leases: dict[str, int], charges: list[RunningCharge]) -> str:
        """The business date a fault is counted under: a live lease's, else a running charge's,
        else the first run still at work, else the newest run (a fault may hit between runs)."""
        if leases:
            return next(iter(leases))
        if charges:
            return charges[0].item
        active = [r.business_date for r in self.runs if r.state not in TERMINAL]
        return self.run_keys(active[0] if active else self.runs[-1].business_date)[0]

    def agent_fault(
        self,
        kind: str,
        entry: dict[str, Any],
        leases: dict[str, int],
        charges: list[RunningCharge],
        spread: float,
    ) -> bool:
        """SIGKILLs the lease agent (started again ``AGENT_BACK`` s later) or stops it for
        0.2-2.5 lease TTLs; landed when a lease was live (its renewals went through it)."""
        assert self.agent is not None
        entry.update(landed=bool(leases))
        entry["key"] = self.fault_key(leases, charges)
        if kind == "agent_sigkill":
            self.agent.signal(signal.SIGKILL)
            self.agent_back = time.monotonic() + AGENT_BACK
        else:
            pause = TTL * (0.2 + 2.3 * spread)
            entry["pause_s"] = round(pause, 2)
            self.agent.signal(signal.SIGSTOP)
            self.agent_back = time.monotonic() + pause
        self.log.append(entry)
        return True

    def celery_scheduler_fault(
        self,
        entry: dict[str, Any],
        leases: dict[str, int],
        charges: list[RunningCharge],
        spread: float,
    ) -> bool:
        """On Celery a try is no child of a scheduler: SIGKILLs one of the two (the other
        standing by); landed when a lease was live (plain: a charge was running)."""
        alive = sorted(self.airflow.scheduler_pids())
        if len(alive) < 2:
            return False
        name = alive[int(spread * len(alive))]
        entry.update(scheduler=name, landed=bool(charges) if self.plain else bool(leases))
        entry["key"] = self.fault_key(leases, charges)
        self.airflow.kill_scheduler(name, signal.SIGKILL)
        self.scheduler_down[name] = time.monotonic() + SCHEDULER_BACK
        self.last_scheduler_kill = len(self.log)
        self.log.append(entry)
        return True

    def route_fault(
        self, kind: str, entry: dict[str, Any], leases: dict[str, int], spread: float
    ) -> bool:
        sessions = self.sink_sessions(1.0 if kind.startswith("sink_") else 0.0)
        in_tx = any(open_ for _, open_ in sessions)
        active = [r.business_date for r in self.runs if r.state not in TERMINAL]
        if kind.startswith("store_"):
            if not leases:
                return False
            entry.update(key=sorted(leases)[int(spread * len(leases))], landed=True)
            if kind == "store_reset":
                entry["landed"] = self.proxy.reset("store") > 0
            else:
                seconds = TTL * (0.1 + 1.1 * spread)
                entry["seconds"] = round(seconds, 2)
                self.proxy.blackhole("store", seconds)
        elif kind == "sink_reset":
            if not active:
                return False
            entry.update(key=next(iter(leases), self.run_keys(active[0])[0]), landed=in_tx)
            entry["landed"] = self.proxy.reset("sink") > 0 and in_tx
        else:  # sink_cut: one billing session ended, one inside a transaction preferred
            if not sessions or not active:
                return False
            candidates = [s for s in sessions if s[1]] or sessions
            pid, open_ = candidates[int(spread * len(candidates))]
            entry.update(key=next(iter(leases), self.run_keys(active[0])[0]), landed=bool(open_))
            self.sink.execute(CUT, (pid,))
        self.log.append(entry)
        return True

    def restart_server(self, kind: str) -> None:
        """Restarts (or crashes and recovers) the lease store's and the billing's server."""
        assert self.server is not None
        leases = self.live_leases()
        entry: dict[str, Any] = {"kind": kind, "t": time.time(), "landed": bool(leases)}
        entry["key"] = self.fault_key(leases, [])
        self.store.close()
        self.sink.close()
        self.server.restart("fast" if kind == "store_restart" else "immediate")
        entry["down_s"] = round(time.time() - entry["t"], 2)
        self.store = psycopg.connect(self.airflow.lease_dsn, autocommit=True)
        self.sink = psycopg.connect(self.airflow.sink_dsn, autocommit=True)
        self.log.append(entry)

    def sink_sessions(self, patience: float) -> list[tuple[int, bool]]:
        """The billing database's sessions (pid, inside a transaction), those inside one
        first; waits up to ``patience`` s for one inside a transaction (they are short)."""
        end = time.monotonic() + patience
        while True:
            rows = [(int(p), bool(o)) for p, o in self.sink.execute(SINK_SESSIONS).fetchall()]
            if (rows and rows[0][1]) or time.monotonic() >= end:
                return rows
            time.sleep(0.005)

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> None:
        self.server_at: set[int] = set()  # which faults (by position) restart the server
        if self.server is not None and self.server_faults > 0:
            count = min(self.server_faults, self.faults)
            self.server_at = set(self.rng.sample(range(self.faults), count))
        self.refresh()
        self.feed()
        # the faults start once a charge runs (a task process takes seconds to start)
        end = time.monotonic() + 180
        while not self.running() and time.monotonic() < end:
            time.sleep(0.3)
        while len(self.log) < self.faults:
            wait = time.monotonic() + self.rng.uniform(*self.gap)
            while time.monotonic() < wait:
                self.tend()
                time.sleep(0.1)
            self.refresh()
            self.feed()
            if not self.inject():
                time.sleep(0.3)
            elif len(self.log) % 50 == 0:  # progress, on stderr (stdout ends with the verdict)
                print(f"{len(self.log)} faults, {len(self.runs)} runs", file=sys.stderr)
        self.settle()

    def settle(self) -> None:
        """The faults are over: routes healed, processes resumed, schedulers back; waits until
        every run (first and duplicate) ended."""
        self.proxy.heal_all()
        for pid in list(self.stopped):
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()
        end = time.monotonic() + self.drain
        while time.monotonic() < end:
            for name in list(self.scheduler_down):
                self.scheduler_down[name] = 0.0
            if self.triggerer_back:
                self.triggerer_back = time.monotonic()
            for name in list(self.worker_down):
                self.worker_down[name] = 0.0
            if self.agent_back:
                self.agent_back = time.monotonic()
            self.tend()
            self.refresh()
            if not self.clears and all(r.state in TERMINAL for r in self.runs):
                break
            time.sleep(1.0)
        for name in SCHEDULERS:  # both back for whoever uses the stack next
            comp = self.airflow.stack.components.get(name)
            if comp is None or not comp.alive():
                self.airflow.start_scheduler(name, wait=False)

    def probe(self) -> dict[str, str]:
        """A fresh holder acquires each key through the public API; 'held' at the end = wedged."""
        if self.plain:
            return dict.fromkeys(self.keys.values(), "granted")
        outcomes: dict[str, str] = {}
        with LeaseStore(self.airflow.lease_dsn, ttl=TTL) as store:
            holder = Holder.process("chaos-probe")
            left = list(self.keys)
            end = time.monotonic() + 2 * TTL + 1
            while left:
                for got in store.acquire_many(left, holder):
                    if got.granted:
                        store.release(got.lease, "chaos probe")
                    outcome = "granted" if got.granted else str(got.outcome)
                    outcomes[self.keys[got.key]] = outcome
                left = [k for k in left if outcomes[self.keys[k]] == Outcome.HELD]
                if time.monotonic() > end:
                    break
                time.sleep(0.5)
        return outcomes


def _rest(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls the REST API, again when the api-server dropped the connection (it does, loaded)."""
    for attempt in range(6):
        try:
            return call(*args, **kwargs)
        except httpx.TransportError:
            if attempt == 5:
                raise
            time.sleep(1.0 + attempt)
    return None


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _through(dsn: str, port: int) -> str:
    """An Airflow Connection URI for ``dsn`` by way of the proxy's route on ``port``."""
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    parts.update(host="127.0.0.1", port=port)
    return airflow_uri(psycopg.conninfo.make_conninfo(**parts)) + "?sslmode=disable"


class LeaseAgent:
    """The stack's lease agent (``runlease agent``), serving the store by way of the proxy's
    store route (the tasks' own spelling of it, so they use it), killed, stopped, restarted."""

    def __init__(self, dsn: str, socket_path: Path) -> None:
        self.dsn = dsn
        self.socket_path = socket_path
        self.process = AgentProcess(dsn, socket_path)

    def signal(self, sig: int) -> None:
        _signal(self.process.proc.pid, sig)

    def back(self) -> None:
        """Resumed if it was stopped, started again if it was killed."""
        self.signal(signal.SIGCONT)
        if self.process.proc.poll() is not None:
            self.process = AgentProcess(self.dsn, self.socket_path)

    def served(self) -> int:
        """Requests the agent served so far (0 when it does not answer)."""
        answer = AgentClient(str(self.socket_path), self.dsn, timeout=5).status()
        return int(answer["served"]) if answer else 0

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.process.stop()


@dataclass
class ChaosStack:
    """A running stack of the campaign's own (see ``chaos_stack``)."""

    airflow: AirflowHarness
    proxy: Proxy
    server: EmbeddedPostgres | None = None  # the store's and billing's own server, if private
    agent: LeaseAgent | None = None  # the lease agent, with ``chaos_stack(agent=True)``
    keep_logs: bool = False  # a campaign found a violation: the stack's logs are kept


@contextlib.contextmanager
def chaos_stack(
    admin_dsn: str = ADMIN_DSN,
    *,
    private_pg: bool = False,
    executor: str = "local",
    agent: bool = False,
) -> Iterator[ChaosStack]:
    """A running Airflow stack of the campaign's own, its tasks' Connections to the lease store
    and the billing database by way of a proxy the campaign controls; stopped afterwards.

    With ``private_pg`` the lease store and the billing database live on a Postgres server of
    their own (Airflow's metadata stays on ``admin_dsn``'s), so the campaign can restart and
    crash it under the tasks. ``executor="celery"``: CeleryExecutor with two Celery workers on
    a Redis of the stack's own (``CeleryHarness``), and the worker fault kinds. ``agent``:
    every task reaches the store through a lease agent (``[exactly_once] agent_socket``) that
    serves it through the proxy's store route, and the agent fault kinds.
    """
    folders = {"chaos": DAGS}
    airflow: AirflowHarness
    if executor == "celery":
        airflow = CeleryHarness(admin_dsn, dag_folders=folders)
    elif executor == "local":
        airflow = AirflowHarness(admin_dsn, dag_folders=folders)
    else:
        raise ValueError(f"executor is local or celery, not {executor!r}")
    deployment = airflow.deployment
    shared = deployment.lease_dsn, deployment.sink_dsn
    server: EmbeddedPostgres | None = None
    proxy: Proxy | None = None
    running: ChaosStack | None = None
    lease_agent: LeaseAgent | None = None
    try:
        upstream = psycopg.conninfo.conninfo_to_dict(admin_dsn)
        if private_pg:
            datadir = Path(tempfile.gettempdir()) / f"eo-chaos-af-{uuid.uuid4().hex[:8]}"
            server = EmbeddedPostgres(free_port(), datadir=datadir).start()
            deployment.lease_dsn = server.create_database("chaos_leases")
            deployment.sink_dsn = server.create_database("chaos_billing")
            migrate(deployment.lease_dsn, LEASE_STORE)
            migrate(deployment.sink_dsn, SINK_FENCE)
            with psycopg.connect(deployment.sink_dsn, autocommit=True) as conn:
                conn.execute(BILLING_SCHEMA.read_text())
            upstream = {"host": "127.0.0.1", "port": server.port}
        proxy = Proxy(str(upstream.get("host", "127.0.0.1")), int(upstream.get("port", 5432)))
        proxy.start()
        store_port = proxy.add_route("store", autocommit=True)
        airflow.stack.extra_env.update(
            {
                f"AIRFLOW_CONN_{LEASE_CONN_ID.upper()}": _through(airflow.lease_dsn, store_port),
                f"AIRFLOW_CONN_{BILLING_CONN_ID.upper()}": _through(
                    airflow.sink_dsn, proxy.add_route("sink", autocommit=False)
                ),
            }
        )
        if agent:
            socket_path = Path(tempfile.mkdtemp(prefix="eo-chaos-agent-")) / "agent.sock"
            airflow.stack.extra_env["AIRFLOW__EXACTLY_ONCE__AGENT_SOCKET"] = str(socket_path)
        airflow.start()
        if agent:
            parts = psycopg.conninfo.conninfo_to_dict(airflow.lease_dsn)
            parts.update(host="127.0.0.1", port=store_port)
            lease_agent = LeaseAgent(psycopg.conninfo.make_conninfo(**parts), socket_path)
        airflow.wait_for_dag(DAG_ID)
        airflow.wait_for_dag(PLAIN_DAG_ID)
        airflow.wait_for_dag(MAPPED_DAG_ID)
        running = ChaosStack(airflow, proxy, server, lease_agent)
        yield running
    finally:
        if lease_agent is not None:
            lease_agent.stop()
        if proxy is not None:
            proxy.stop()
        deployment.lease_dsn, deployment.sink_dsn = shared  # dropped with the stack
        if running is not None and running.keep_logs:
            print(f"the stack's logs: {keep_logs(airflow.stack.home)}", file=sys.stderr)
        airflow.stop()
        if server is not None:
            server.destroy()


def campaign(
    stack: ChaosStack,
    seed: int,
    faults: int,
    *,
    plain: bool,
    server_faults: int = 0,
    **options: Any,
) -> dict[str, Any]:
    """Runs one campaign on a ``chaos_stack``; returns the checker's verdict (also printed,
    last line JSON).

    Args:
        stack: the running stack (both schedulers up).
        seed: chooses the schedule.
        faults: how many faults to inject.
        plain: runs ``chaos_billing_plain`` (the plugin disabled) instead of ``chaos_billing``.
        server_faults: how many of the faults restart or crash the store's own server (a
            ``chaos_stack(private_pg=True)``).
        options: AirflowCampaign fields (in_flight, customers, delay, gap, kinds, ...).
    """
    started = time.monotonic()
    airflow = stack.airflow
    run = AirflowCampaign(
        seed,
        faults,
        plain,
        airflow,
        stack.proxy,
        server=stack.server,
        server_faults=server_faults if stack.server is not None else 0,
        agent=stack.agent,
        **options,
    )
    try:
        run.run()
        probe = run.probe()
    finally:
        run.close()
    seconds = round(time.monotonic() - started, 1)
    customers = [f"cust-{n:04d}" for n in range(1, run.customers + 1)]
    keys: dict[str, list[str]] = {}  # each checker run's customers (--mapped: a tenant's share)
    for business_date in sorted({r.business_date for r in run.runs}):
        items = run.run_keys(business_date)
        keys.update({item: customers[i :: len(items)] for i, item in enumerate(items)})
    assert airflow.deployment.processor is not None
    log = {
        "mode": "plain" if plain else "fenced",
        "seed": seed,
        "dag_id": run.dag_id,
        "task_id": TASK,
        "keys": keys,
        "runs": [[r.run_id, r.business_date, r.duplicate] for r in run.runs],
        "faults": run.log,
        "probe": probe,
        "processor_url": airflow.deployment.processor.url,
        "clear_errors": run.clear_errors,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(log, f)
    user, password = airflow.admin
    checked: subprocess.CompletedProcess[str] | None = None
    try:
        checked = subprocess.run(
            [
                sys.executable, "-m", "tests.chaos.airflow_checker",
                "--sink-dsn", airflow.sink_dsn, "--airflow", airflow.base_url, "--log", f.name,
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO,
            env={**os.environ, "CHAOS_AIRFLOW_USER": user, "CHAOS_AIRFLOW_PASSWORD": password},
        )  # fmt: skip
    finally:
        kept = checked is not None and checked.returncode != 0 and not plain  # a violation
        if kept:
            stack.keep_logs = True
        else:
            os.unlink(f.name)
    print(checked.stdout, end="")
    if not checked.stdout.strip():
        raise RuntimeError(f"the checker printed nothing:\n{checked.stderr}")
    verdict: dict[str, Any] = json.loads(checked.stdout.strip().splitlines()[-1])
    verdict.update(seconds=seconds)
    if stack.agent is not None:  # the tries' lease statements the agent served
        verdict["agent_served"] = stack.agent.served()
    if kept:
        verdict["campaign_log"] = f.name
    print(json.dumps(verdict), flush=True)
    return verdict


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=300)
    parser.add_argument("--plain", action="store_true", help="the plugin disabled")
    parser.add_argument("--dsn", default=os.environ.get("CHAOS_ADMIN_DSN", ADMIN_DSN))
    parser.add_argument("--in-flight", type=int, default=5, help="business dates at work at once")
    parser.add_argument("--customers", type=int, default=20, help="customers per run")
    parser.add_argument(
        "--private-pg",
        type=int,
        default=0,
        help="the lease store on a server of its own, restarted or crashed this many times",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "celery"),
        default="local",
        help="celery: two Celery workers on Redis, and the worker fault kinds",
    )
    parser.add_argument(
        "--agent", action="store_true", help="tasks reach the store through a lease agent"
    )
    parser.add_argument(
        "--mapped",
        action="store_true",
        help=f"the charge mapped per tenant ({', '.join(TENANTS)}), each a lease of its own",
    )
    parser.add_argument(
        "--kinds",
        help=f"fault kinds, comma-separated (default: all the stack has; {KINDS + WORKER_KINDS})",
    )
    args = parser.parse_args(argv)
    kinds = KINDS + (WORKER_KINDS if args.executor == "celery" else ())
    kinds += AGENT_KINDS if args.agent else ()
    if args.kinds:
        kinds = tuple(args.kinds.split(","))
    started = time.monotonic()
    with chaos_stack(
        args.dsn, private_pg=args.private_pg > 0, executor=args.executor, agent=args.agent
    ) as stack:
        up = round(time.monotonic() - started, 1)
        verdict = campaign(
            stack,
            args.seed,
            args.faults,
            plain=args.plain,
            server_faults=args.private_pg,
            in_flight=args.in_flight,
            customers=args.customers,
            kinds=kinds,
            mapped=args.mapped,
        )
    verdict.update(stack_start_s=up, total_s=round(time.monotonic() - started, 1))
    print(json.dumps(verdict))
    if args.plain:
        return int(not verdict["duplicate_effects"])
    return int(bool(bad(verdict)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
