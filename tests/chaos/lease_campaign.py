"""The lease-level fault campaign: long-lived holder processes, a seeded schedule of faults.

Holder processes (tests/chaos/holder.py, forked from a fork server that has imported it) work
keys in groups of three, one key after another, through a lease store and a sink database of
the campaign's own, each holder reaching Postgres through the campaign's proxy
(tests/chaos/proxy.py). A seed chooses the faults, their order, their targets (by position
among the running holders, a live lease preferred) and their timing:

* process faults: SIGKILL (the killed holder is replaced, as Airflow retries a task), SIGSTOP
  then SIGCONT within the lease and past it, the holder's sink session ended
  (``pg_terminate_backend``);
* TCP faults on the holder's route to the store or to the sink: black-holed (nothing
  forwarded, sockets open, then healed), reset (both sides closed), slowed (each chunk
  delayed), and an ambiguous commit (the commit reaches the server, its answer is dropped);
* with ``--private-pg N``: the one server holding store and sink restarted, or crashed
  (immediate stop, crash recovery), at most N times (they cost seconds each).

With ``--processor-groups N``, N of the groups charge each item at a payment processor (the
demo's Stripe stand-in, in a process of its own) through ``ExternalCalls.call`` with the stripe
SDK, as ``dags/billing_charges.py`` does, the record writing the item's sink row: one processor
honouring idempotency keys, and (fenced, N >= 2) every second processor group on a second one
that also checks fencing tokens; every third processor group (the third, the sixth) charges
through ``ExternalCalls.call_many`` instead, four items at the processor at once (claims and
records in batches). Plain, those holders charge with no key and no ledger. Half of
the process faults (by the seed) are aimed at a holder in the window between the processor's
answer and the record, when one is there (the incident's window); the log marks such faults.
Faults at the processors themselves join them: the processor a holder's group charges at
answers its next requests with a 500 (nothing charged), drops the connection, or charges and
answers only after the holder's client timed out (the ambiguous answer); and on the holder's TCP
route to the processor (each holder reaches its processor through the proxy too): black-holed
(a request already at the processor is charged, its answer held back past the client's timeout;
one sent meanwhile never arrives) or reset (landed when a request was out).

A fault counts as landed when it hit while the holder had a lease or a sink transaction live
(read from the holder's shared state while it is stopped, for a signal; when it fired, for an
ambiguous commit; in the session's own row, for a cut); a holder in the call window is live.
Then a fresh holder acquires every key through the public API (a wedged key is still held
after two lease lifetimes), and the independent checker judges the sink and the processors.

    .venv/bin/python -m tests.chaos.lease_campaign --seed 1 --faults 10000
    .venv/bin/python -m tests.chaos.lease_campaign --seed 1 --faults 300 --plain   # no plugin
    .venv/bin/python -m tests.chaos.lease_campaign --seed 1 --faults 300 --private-pg 4
    .venv/bin/python -m tests.chaos.lease_campaign --seed 1 --faults 300 --processor-groups 2

The last line is the checker's JSON verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres
from airflow_plugins.demo.processor import ProcessorProcess, inject_fault
from airflow_plugins.lease import SINK_FENCE, Holder, LeaseStore, Outcome, migrate
from tests.chaos import holder as holder_module
from tests.chaos.holder import ACCEPTED, CALL, FIELDS, IDLE, Config
from tests.chaos.proxy import Proxy
from tests.lease.ports import free_port

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
EFFECTS = """
CREATE TABLE effects (
    id bigserial PRIMARY KEY, key text NOT NULL, item text NOT NULL, token bigint NOT NULL,
    writer text NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())
"""
PROCESS_KINDS = ("sigkill", "sigstop_within_lease", "sigstop_past_lease", "sink_cut")
TCP_KINDS = tuple(
    f"{route}_{fault}"
    for route in ("store", "sink")
    for fault in ("blackhole", "reset", "slow", "ambiguous_commit")
)
# a batched processor group's holders: items at the processor at once (ExternalCalls.call_many)
BATCHED_IN_FLIGHT = 4
# with --processor-groups: at the processor the slot's group charges at, consumed by its next
# charge requests: it answers 500 before charging, drops the connection, or charges and answers
# after the holder's client timed out (the ambiguous answer)
PROCESSOR_KINDS = ("processor_500", "processor_down", "processor_timeout")
# with --processor-groups: on the holder's TCP route to its processor (the proxy's): black-holed
# (a request already at the processor is charged, its answer held past the client's timeout;
# one sent meanwhile never reaches it: either way the holder does not know) or reset (landed
# when it closed a connection with a request out)
PROCESSOR_ROUTE_KINDS = ("processor_blackhole", "processor_reset")
# with --private-pg: capped per run, they cost seconds each
SERVER_KINDS = ("store_restart", "store_crash")
CUT = """
SELECT xact_start IS NOT NULL, pg_terminate_backend(pid) FROM pg_stat_activity
WHERE pid = %s AND datname = current_database()
"""
KEY = "chaos_billing/charge/2026-12-01/run-{:05d}"


@dataclass(eq=False)
class Slot:
    """One holder's place: its process (replaced when killed) and the keys it was sent."""

    index: int
    group: int
    name: str
    proc: BaseProcess | None = None
    pipe: multiprocessing.connection.Connection | None = None
    pending: list[str] = field(default_factory=list)
    stopped_until: float = 0.0
    lives: int = 0
    sink_dsn: str = ""  # through the slot's routes of the proxy
    lease_dsn: str = ""
    processor: str = ""  # the processor's name (a key of Campaign.processors), or none
    processor_url: str = ""  # its base URL through the slot's route of the proxy


@dataclass
class Campaign:
    """The state of one campaign run."""

    seed: int
    faults: int
    plain: bool
    lease_dsn: str
    sink_dsn: str
    proxy: Proxy
    holders: int = 3
    items: int = 8
    ttl: float = 0.6
    groups: int = 6
    item_sleep: float = 0.02
    gap: tuple[float, float] = (0.02, 0.08)  # seconds between faults
    # a regression case may pick a few; none: every kind (the processor's with processor groups)
    kinds: tuple[str, ...] = ()
    drain: float = 60.0  # seconds the holders get to finish once the faults end
    processor_groups: int = 0  # groups charging at a processor
    processors: dict[str, str] = field(default_factory=dict)  # name -> base URL
    server: EmbeddedPostgres | None = None
    server_faults: int = 0
    rng: random.Random = field(init=False)
    slots: list[Slot] = field(default_factory=list)
    keys: dict[str, list[str]] = field(default_factory=dict)
    current: dict[int, str] = field(default_factory=dict)  # group -> its key in work
    processor_keys: dict[str, str] = field(default_factory=dict)  # key -> its processor
    batched_keys: list[str] = field(default_factory=list)  # charged through call_many
    log: list[dict[str, Any]] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    spawned: int = 0
    stuck: list[str] = field(default_factory=list)
    gave_up: int = 0  # holders that stopped working a key past their limit (then retried)

    def __post_init__(self) -> None:
        processor_kinds = PROCESSOR_KINDS + PROCESSOR_ROUTE_KINDS
        known = PROCESS_KINDS + TCP_KINDS + (processor_kinds if self.processor_groups else ())
        self.kinds = self.kinds or known
        unknown = set(self.kinds) - set(known)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}: {known}")
        self.rng = random.Random(self.seed)
        self.server_at: set[int] = set()  # which faults (by position) restart the server
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["tests.chaos.holder"])
        n = self.groups * self.holders
        self.state: Any = self.ctx.RawArray("l", n * FIELDS)
        self.admin = psycopg.connect(self.sink_dsn, autocommit=True)

    # -- holders ------------------------------------------------------------------------------

    def _dsn(self, dsn: str, route: str) -> str:
        port = self.proxy.add_route(route, autocommit=route.startswith("store"))
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
        parts.update(host="127.0.0.1", port=port, sslmode="disable", gssencmode="disable")
        return psycopg.conninfo.make_conninfo(**parts)

    def _url(self, url: str, route: str) -> str:
        parts = urllib.parse.urlsplit(url)
        port = self.proxy.add_route(
            route, autocommit=False, upstream=(parts.hostname or "127.0.0.1", parts.port or 80)
        )
        return f"{parts.scheme}://127.0.0.1:{port}"

    def setup(self) -> None:
        for index in range(self.groups * self.holders):
            slot = Slot(index, index // self.holders, f"holder-{index:02d}")
            self.slots.append(slot)
            slot.sink_dsn = self._dsn(self.sink_dsn, f"sink{index}")
            slot.lease_dsn = "" if self.plain else self._dsn(self.lease_dsn, f"store{index}")
            slot.processor = self.processor_of(slot.group)
            if slot.processor:
                slot.processor_url = self._url(self.processors[slot.processor], f"processor{index}")
        for slot in self.slots:
            self.spawn(slot)

    def processor_of(self, group: int) -> str:
        """The processor ``group`` charges at ("": it writes SQL rows only)."""
        if group >= self.processor_groups:
            return ""
        if group % 2 == 1 and "tokens" in self.processors:
            return "tokens"
        return "idempotent"

    def in_flight_of(self, group: int) -> int:
        """How many items ``group``'s holders have at the processor at once (1: ``call``)."""
        return BATCHED_IN_FLIGHT if self.processor_of(group) and group % 3 == 2 else 1

    def spawn(self, slot: Slot) -> None:
        """Starts (or replaces) the slot's process and sends it the keys it has not done."""
        cfg = Config(
            slot=slot.index,
            name=f"{slot.name}.{slot.lives}",
            sink_dsn=slot.sink_dsn,
            lease_dsn=slot.lease_dsn,
            items=self.items,
            ttl=self.ttl,
            item_sleep=self.item_sleep,
            processor_url=slot.processor_url,
            in_flight=self.in_flight_of(slot.group),
        )
        slot.lives += 1
        ours, theirs = self.ctx.Pipe()
        base = slot.index * FIELDS
        self.state[base] = self.state[base + 2] = 0
        proc = self.ctx.Process(target=holder_module.serve, args=(cfg, theirs, self.state))
        proc.daemon = True
        proc.start()
        theirs.close()
        slot.proc, slot.pipe, slot.stopped_until = proc, ours, 0.0
        self.spawned += 1
        for key in slot.pending:
            ours.send((key, self.number(key)))

    def number(self, key: str) -> int:
        return int(key.rsplit("-", 1)[1])

    def send(self, slot: Slot, key: str) -> None:
        slot.pending.append(key)
        assert slot.pipe is not None
        with contextlib.suppress(OSError):
            slot.pipe.send((key, self.number(key)))

    def new_key(self, group: int) -> None:
        key = KEY.format(len(self.keys))
        self.keys[key] = [f"item-{n:03d}" for n in range(self.items)]
        self.current[group] = key
        if processor := self.processor_of(group):
            self.processor_keys[key] = processor
            if self.in_flight_of(group) > 1:
                self.batched_keys.append(key)
        for slot in self.slots[group * self.holders : (group + 1) * self.holders]:
            self.send(slot, key)

    def pump(self, timeout: float, *, feed: bool = True) -> None:
        """Reads holders' answers for up to ``timeout`` s; resumes stopped holders when due."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.stopped_until and now >= slot.stopped_until:
                self.signal(slot, signal.SIGCONT)
                slot.stopped_until = 0.0
        pipes = {slot.pipe: slot for slot in self.slots if slot.pipe is not None}
        due = [s.stopped_until for s in self.slots if s.stopped_until]
        if due:
            timeout = max(0.0, min(timeout, min(due) - now))
        for pipe in multiprocessing.connection.wait(list(pipes), timeout):
            slot = pipes[pipe]  # type: ignore[index]
            try:
                while pipe.poll():  # type: ignore[union-attr]
                    key, outcome = pipe.recv()  # type: ignore[union-attr]
                    with contextlib.suppress(ValueError):
                        slot.pending.remove(key)
                    if outcome in ("completed", "succeeded"):
                        self.done.add(key)
                    elif outcome == "gave_up":  # past its limit: a retry, as Airflow's
                        self.gave_up += 1
                        self.send(slot, key)
            except (EOFError, OSError):
                self.spawn(slot)  # died on its own: started again, as a retry
        if feed:
            for group in range(self.groups):
                if self.current.get(group) in self.done or group not in self.current:
                    self.new_key(group)

    def signal(self, slot: Slot, sig: int) -> None:
        if slot.proc is not None and slot.proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.proc.pid, sig)

    # -- faults -------------------------------------------------------------------------------

    def live(self, slot: Slot) -> bool:
        return bool(self.state[slot.index * FIELDS] != IDLE)

    def in_window(self, slot: Slot) -> bool:
        """The processor answered the holder's call and it has not recorded it yet."""
        return bool(self.state[slot.index * FIELDS] == ACCEPTED)

    def key_of(self, slot: Slot) -> str:
        return KEY.format(self.state[slot.index * FIELDS + 1])

    def inject(self) -> None:
        kind = self.rng.choice(self.kinds)
        pick, spread = self.rng.random(), self.rng.random()
        if len(self.log) in self.server_at:
            self.restart_server(SERVER_KINDS[int(spread * len(SERVER_KINDS))])
            return
        if self.plain and kind.startswith("store_"):
            kind = "sink_" + kind.removeprefix("store_")  # no store: its route's fault at the sink
        running = [s for s in self.slots if not s.stopped_until]
        targets = [s for s in running if self.live(s)] or running
        if self.processor_groups > 0 and self.rng.random() < 0.5 and kind in PROCESS_KINDS:
            # aimed at the window between the processor's answer and the record, if one is open
            targets = [s for s in running if self.in_window(s)] or targets
        if kind in PROCESSOR_KINDS + PROCESSOR_ROUTE_KINDS:  # a processor group's holder
            targets = [s for s in targets if s.processor] or [s for s in running if s.processor]
        if not targets:
            return
        slot = targets[int(pick * len(targets))]
        entry: dict[str, Any] = {"kind": kind, "key": self.key_of(slot), "t": time.time()}
        entry["window"] = self.in_window(slot)  # a signal's is read again with the holder stopped
        entry["landed"] = self.hit(kind, slot, spread, entry)
        self.log.append(entry)

    def hit(self, kind: str, slot: Slot, spread: float, entry: dict[str, Any]) -> bool:
        """Injects ``kind`` at ``slot``; True when it landed (False: may land later)."""
        ttl = self.ttl
        if kind == "sigkill":
            self.signal(slot, signal.SIGSTOP)  # frozen: its state tells whether it held
            landed, entry["window"] = self.live(slot), self.in_window(slot)
            self.signal(slot, signal.SIGKILL)
            if slot.proc is not None:
                slot.proc.join(5)
            self.spawn(slot)  # the retry of the killed try
            return landed
        if kind.startswith("sigstop"):
            self.signal(slot, signal.SIGSTOP)
            within = kind == "sigstop_within_lease"
            pause = ttl * (0.2 + 0.4 * spread if within else 1.5 + spread)
            slot.stopped_until = time.monotonic() + pause
            entry["window"] = self.in_window(slot)
            return self.live(slot)
        if kind in PROCESSOR_KINDS:
            mode = {"processor_500": "error_500", "processor_down": "down"}.get(
                kind, "timeout_after_commit"
            )
            times = 1 if mode == "timeout_after_commit" else 1 + int(spread * 3)
            url = self.processors[slot.processor]
            inject_fault(url, mode, times=times, delay=holder_module.PROCESSOR_TIMEOUT + 0.3)
            return self.live(slot)
        if kind == "sink_cut":
            pid = self.state[slot.index * FIELDS + 2]
            rows = self.admin.execute(CUT, (pid,)).fetchall() if pid else []
            return any(in_transaction for in_transaction, _ in rows)
        route_kind, fault = kind.split("_", 1)
        route = f"{route_kind}{slot.index}"
        landed = self.live(slot)
        if fault == "blackhole":
            self.proxy.blackhole(route, ttl * (0.5 + 2 * spread))
        elif fault == "reset":
            landed = self.proxy.reset(route) > 0 and landed
            if route_kind == "processor":  # landed when it cut a request out at the processor
                landed = landed and self.state[slot.index * FIELDS] == CALL
        elif fault == "slow":
            self.proxy.slow(route, ttl * (0.02 + 0.2 * spread), ttl * (1 + 2 * spread))
        else:  # ambiguous_commit: landed when it fires within a lease or a sink transaction

            def fired() -> None:
                entry["landed"] = self.live(slot)
                entry["fired"] = time.time()

            self.proxy.arm_ambiguous(route, fired, 2 * ttl)
            return False
        return landed

    def restart_server(self, kind: str) -> None:
        """Restarts (or crashes and recovers) the private server under the holders."""
        assert self.server is not None
        live = [self.key_of(s) for s in self.slots if self.live(s)]
        at = time.time()
        self.admin.close()
        self.server.restart("fast" if kind == "store_restart" else "immediate")
        self.admin = psycopg.connect(self.sink_dsn, autocommit=True)
        key = live[0] if live else next(iter(self.keys))
        self.log.append({"kind": kind, "key": key, "t": at, "landed": bool(live)})

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> None:
        if self.server is not None and self.server_faults > 0:
            # spread over the run, at positions the seed chooses
            count = min(self.server_faults, self.faults)
            self.server_at = set(self.rng.sample(range(self.faults), count))
        self.setup()
        self.pump(0)
        while len(self.log) < self.faults:
            end = time.monotonic() + self.rng.uniform(*self.gap)
            while (left := end - time.monotonic()) > 0:
                self.pump(left)
            self.inject()
        self.proxy.heal_all()
        for slot in self.slots:
            if slot.stopped_until:
                self.signal(slot, signal.SIGCONT)
                slot.stopped_until = 0.0
        end = time.monotonic() + self.drain
        while time.monotonic() < end and (
            set(self.keys) - self.done or any(s.pending for s in self.slots)
        ):
            self.pump(0.2, feed=False)
        # still working a key long after the faults ended: a try that never ends
        self.stuck = [slot.name for slot in self.slots if slot.pending]
        for slot in self.slots:
            if slot.pipe is not None:
                with contextlib.suppress(OSError):
                    slot.pipe.send(None)
        end = time.monotonic() + 5
        for slot in self.slots:
            if slot.proc is not None:
                slot.proc.join(max(0.0, end - time.monotonic()))
                if slot.proc.is_alive():  # stuck: ended here (the probe then tries its keys)
                    self.signal(slot, signal.SIGKILL)
                    slot.proc.join(5)
        self.admin.close()

    def probe(self) -> dict[str, str]:
        """A fresh holder acquires each key through the public API; 'held' at the end = wedged."""
        if self.plain:
            return {key: "granted" for key in self.keys}
        outcomes: dict[str, str] = {}
        with LeaseStore(self.lease_dsn, ttl=self.ttl) as store:
            holder = Holder.process("chaos-probe")
            left = list(self.keys)
            end = time.monotonic() + 2 * self.ttl + 1
            while left:
                for start in range(0, len(left), 500):
                    for got in store.acquire_many(left[start : start + 500], holder):
                        if got.granted:
                            store.release(got.lease, "chaos probe")
                        outcomes[got.key] = "granted" if got.granted else str(got.outcome)
                left = [key for key in left if outcomes[key] == Outcome.HELD]
                if time.monotonic() > end:
                    break
                time.sleep(0.2)
        return outcomes


@contextlib.contextmanager
def databases(admin_dsn: str) -> Iterator[tuple[str, str]]:
    """A lease store and a sink database of the campaign's own, dropped afterwards."""
    names = [f"chaos_{part}_{uuid.uuid4().hex[:8]}" for part in ("lease", "sink")]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = admin_dsn.rsplit("/", 1)[0]
    try:
        yield f"{base}/{names[0]}", f"{base}/{names[1]}"
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def campaign(
    seed: int,
    faults: int,
    *,
    plain: bool,
    admin_dsn: str = ADMIN_DSN,
    private_pg: int = 0,
    **options: Any,
) -> dict[str, Any]:
    """Runs one campaign and returns the checker's verdict (also printed, last line JSON).

    Args:
        seed: chooses the schedule.
        faults: how many faults to inject.
        plain: holders without lease and fence (the plugin disabled).
        admin_dsn: the server the campaign's databases are made on.
        private_pg: when > 0, a private server of the campaign's own instead, restarted or
            crashed at most that many times.
        options: Campaign fields (ttl, groups, items, processor_groups, ...).
    """
    if private_pg <= 0:
        return _campaign(seed, faults, plain, admin_dsn, None, 0, options)
    with private_server() as server:
        return _campaign(seed, faults, plain, server.dsn(), server, private_pg, options)


@contextlib.contextmanager
def private_server() -> Iterator[EmbeddedPostgres]:
    """A Postgres server of the campaign's own (``--private-pg``), removed afterwards: the one a
    campaign restarts and crashes under its holders or workers."""
    datadir = Path(tempfile.gettempdir()) / f"eo-chaos-{uuid.uuid4().hex[:8]}"
    server = EmbeddedPostgres(free_port(), datadir=datadir)
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def _campaign(
    seed: int,
    faults: int,
    plain: bool,
    admin_dsn: str,
    server: EmbeddedPostgres | None,
    server_faults: int,
    options: dict[str, Any],
) -> dict[str, Any]:
    upstream = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    with databases(admin_dsn) as (lease_dsn, sink_dsn):
        migrate(lease_dsn)
        migrate(sink_dsn, SINK_FENCE)
        with psycopg.connect(sink_dsn, autocommit=True) as conn:
            conn.execute(EFFECTS)
        with contextlib.ExitStack() as stack:
            processors = _processors(stack, int(options.get("processor_groups", 0)), plain)
            proxy = Proxy(str(upstream.get("host", "127.0.0.1")), int(upstream.get("port", 5432)))
            proxy.start()
            run = Campaign(
                seed, faults, plain, lease_dsn, sink_dsn, proxy, processors=processors, **options
            )
            run.server, run.server_faults = server, server_faults
            started = time.monotonic()
            try:
                run.run()
            finally:
                proxy.stop()
            seconds = round(time.monotonic() - started, 1)
            log = {
                "mode": "plain" if plain else "fenced",
                "seed": seed,
                "keys": run.keys,
                "faults": run.log,
                "probe": run.probe(),
                "stuck": run.stuck,
                "gave_up": run.gave_up,
                "seconds": seconds,
                "processors": processors,
                "processor_keys": run.processor_keys,
            }
            checked = _check(sink_dsn, log)
    print(checked.stdout, end="")
    if not checked.stdout.strip():
        raise RuntimeError(f"the checker printed nothing:\n{checked.stderr}")
    verdict: dict[str, Any] = json.loads(checked.stdout.strip().splitlines()[-1])
    verdict.update(
        seconds=seconds,
        faults_per_second=round(len(run.log) / seconds, 2),
        holder_processes=run.spawned,
        batched_processor_keys=len(run.batched_keys),
    )
    print(json.dumps(verdict))
    return verdict


def _processors(stack: contextlib.ExitStack, groups: int, plain: bool) -> dict[str, str]:
    """The payment processors the processor groups charge at, each in a process of its own:
    ``idempotent`` (Stripe's idempotency keys) and, fenced with two groups or more, ``tokens``
    (idempotency keys and fencing tokens; plain holders send no token, which it refuses)."""
    if groups <= 0:
        return {}
    names = {"idempotent": False} if plain or groups < 2 else {"idempotent": False, "tokens": True}
    urls: dict[str, str] = {}
    for name, check_tokens in names.items():
        out = Path(tempfile.gettempdir()) / f"eo-chaos-processor-{uuid.uuid4().hex[:8]}.log"
        process = ProcessorProcess(out, check_tokens=check_tokens)
        stack.callback(out.unlink, missing_ok=True)
        stack.callback(process.stop)
        urls[name] = process.start()
    return urls


def _check(sink_dsn: str, log: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Runs the independent checker on the run's log (processors still up: it reads them)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(log, f)
    try:
        return subprocess.run(
            [sys.executable, "-m", "tests.chaos.checker", "--sink-dsn", sink_dsn, "--log", f.name],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.unlink(f.name)


def _bad(verdict: dict[str, Any], plain: bool) -> bool:
    """A violation: anything wrong with the plugin on; with it off, all but duplicates."""
    bad = verdict["stale_writes_accepted"] + verdict["items_missed"] + verdict["keys_wedged"]
    bad += verdict["holders_stuck"] + verdict["processor_items_missed"]
    duplicates = verdict["duplicate_effects"] + verdict["processor_duplicates"]
    return bool(bad or (duplicates and not plain))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=10000)
    parser.add_argument("--plain", action="store_true", help="holders without lease and fence")
    parser.add_argument("--dsn", default=os.environ.get("CHAOS_ADMIN_DSN", ADMIN_DSN))
    parser.add_argument("--ttl", type=float, default=0.6, help="the holders' lease TTL, seconds")
    parser.add_argument("--groups", type=int, default=6, help="keys worked at once (3 holders)")
    parser.add_argument(
        "--processor-groups",
        type=int,
        default=0,
        metavar="N",
        help="groups charging each item at a payment processor (stripe SDK, ExternalCalls)",
    )
    parser.add_argument(
        "--drain", type=float, default=60.0, help="seconds to finish in once the faults end"
    )
    parser.add_argument(
        "--kinds",
        default="",
        help="the fault kinds to choose from, comma-separated (default: every kind; the "
        "processor's with --processor-groups)",
    )
    parser.add_argument(
        "--private-pg",
        type=int,
        default=0,
        metavar="N",
        help="run on a private Postgres of the campaign's own, restarted or crashed up to N times",
    )
    args = parser.parse_args(argv)
    verdict = campaign(
        args.seed,
        args.faults,
        plain=args.plain,
        admin_dsn=args.dsn,
        private_pg=args.private_pg,
        ttl=args.ttl,
        groups=args.groups,
        kinds=tuple(k for k in args.kinds.split(",") if k),
        drain=args.drain,
        processor_groups=args.processor_groups,
    )
    return int(_bad(verdict, args.plain))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
