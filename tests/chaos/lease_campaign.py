"""The lease-level fault campaign: many holder processes, a seeded schedule of faults.

Keys are worked by several holder processes each (tests/chaos/holder.py), through a lease store
and a sink database of the campaign's own on the local Postgres. A seed chooses the faults, their
order, their targets (by position among the live holders) and their timing: SIGKILL (the killed
holder is started again, as Airflow retries a task), SIGSTOP then SIGCONT within the lease and
past it, the holder's sink session cut (pg_terminate_backend). A fault counts as landed when its
holder held a lease (or, disabled, was writing) at the time; a cut, when the session was inside a
transaction. Then a fresh holder acquires every key through the public API (a wedged key is
still held after two lease lifetimes), and the independent checker judges the sink.

    .venv/bin/python -m tests.chaos.lease_campaign --seed 1 --faults 10000
    .venv/bin/python -m tests.chaos.lease_campaign --seed 1 --faults 300 --plain   # no plugin
    .venv/bin/python -m tests.chaos.lease_campaign --seed 1 --faults 300 --private-pg 4

The last line is the checker's JSON verdict.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres
from airflow_plugins.lease import SINK_FENCE, Holder, LeaseStore, Outcome, migrate
from tests.lease.ports import free_port

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
HOLDER = [sys.executable, "-m", "tests.chaos.holder"]
EFFECTS = """
CREATE TABLE effects (
    id bigserial PRIMARY KEY, key text NOT NULL, item text NOT NULL, token bigint NOT NULL,
    writer text NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())
"""
KINDS = ("sigkill", "sigstop_within_lease", "sigstop_past_lease", "sink_cut")
# with --private-pg: the one server holding the store and the sink restarted, or crashed
# (an immediate stop, then crash recovery); capped per run, they cost seconds each
SERVER_KINDS = ("store_restart", "store_crash")
CUT = """
SELECT pid, xact_start IS NOT NULL FROM pg_stat_activity
WHERE datname = current_database() AND application_name = %s
"""


@dataclass
class Proc:
    """One holder process and the file its events go to."""

    key: str
    name: str
    popen: subprocess.Popen[bytes]
    out: Path  # the holder's own file (a shared descriptor would share its offset)
    stopped_until: float = 0.0

    def events(self) -> list[str]:
        lines = self.out.read_text().splitlines()
        return [json.loads(line)["event"] for line in lines if line.endswith("}")]

    def live_lease(self) -> bool:
        """Holds a lease (or, disabled, is writing) now."""
        seen = self.events()
        return "granted" in seen and not {"completed", "succeeded"} & set(seen[-1:])


@dataclass
class Campaign:
    """The state of one campaign run."""

    seed: int
    faults: int
    plain: bool
    lease_dsn: str
    sink_dsn: str
    holders: int = 3
    items: int = 8
    ttl: float = 1.5
    width: int = 4
    tmp: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="chaos-"))
    server: EmbeddedPostgres | None = None
    server_faults_left: int = 0
    rng: random.Random = field(init=False)
    procs: list[Proc] = field(default_factory=list)
    keys: dict[str, list[str]] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)
    done: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def start(self, key: str, name: str) -> None:
        fd, path = tempfile.mkstemp(prefix="chaos-holder-", suffix=".jsonl", dir=self.tmp)
        out = os.fdopen(fd, "w")
        args = [
            *HOLDER,
            "--sink-dsn",
            self.sink_dsn,
            "--key",
            key,
            "--name",
            name,
            "--items",
            str(self.items),
            "--ttl",
            str(self.ttl),
        ]
        args += ["--plain"] if self.plain else ["--lease-dsn", self.lease_dsn]
        popen = subprocess.Popen(args, stdout=out, stderr=subprocess.DEVNULL)
        out.close()
        self.procs.append(Proc(key, name, popen, Path(path)))

    def new_key(self) -> None:
        key = f"chaos_billing/charge/2026-12-01/run-{len(self.keys):05d}"
        self.keys[key] = [f"item-{n:03d}" for n in range(self.items)]
        for h in range(self.holders):
            self.start(key, f"{key}#{h}")

    def reap(self) -> None:
        now = time.monotonic()
        for proc in self.procs:
            if proc.stopped_until and now >= proc.stopped_until:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(signal.SIGCONT)
                proc.stopped_until = 0.0
        alive = []
        for proc in self.procs:
            if proc.popen.poll() is None:
                alive.append(proc)
            elif {"completed", "succeeded"} & set(proc.events()):
                self.done.add(proc.key)
        for proc in self.procs:
            if proc not in alive:
                proc.out.unlink(missing_ok=True)
        self.procs = alive
        for key in self.keys:
            if key not in self.done and not any(p.key == key for p in self.procs):
                self.start(key, f"{key}#r{self.rng.randrange(10**6)}")  # all died: retried

    def inject(self) -> None:
        kind = self.rng.choice(KINDS + (SERVER_KINDS if self.server else ()))
        if kind in SERVER_KINDS:
            if self.server is None or self.server_faults_left <= 0:
                kind = KINDS[self.rng.randrange(len(KINDS))]
            else:
                self.server_faults_left -= 1
                self.restart_server(kind)
                return
        pick = self.rng.random()
        pause = self.rng.uniform(0.2, 0.6) * self.ttl
        if kind == "sigstop_past_lease":
            pause = self.ttl * self.rng.uniform(1.5, 2.5)
        running = sorted((p for p in self.procs if not p.stopped_until), key=lambda p: p.name)
        # aimed at a live lease (or live writes) when there is one, else at any holder
        targets = [p for p in running if p.live_lease()] or running
        if not targets:
            return
        proc = targets[int(pick * len(targets))]
        landed = proc.live_lease()
        try:
            if kind == "sink_cut":
                landed = self.cut(proc)
            elif kind == "sigkill":
                proc.popen.kill()
                self.start(proc.key, f"{proc.name}+")  # the retry of the killed try
            else:
                proc.popen.send_signal(signal.SIGSTOP)
                proc.stopped_until = time.monotonic() + pause
        except ProcessLookupError:
            landed = False
        self.log.append({"kind": kind, "key": proc.key, "t": time.time(), "landed": landed})

    def restart_server(self, kind: str) -> None:
        """Restarts (or crashes and recovers) the private server under the holders."""
        assert self.server is not None
        live = [p.key for p in self.procs if p.live_lease()]
        at = time.time()
        self.server.restart("fast" if kind == "store_restart" else "immediate")
        key = live[0] if live else next(iter(self.keys))
        self.log.append({"kind": kind, "key": key, "t": at, "landed": bool(live)})

    def cut(self, proc: Proc) -> bool:
        """Ends the holder's sink session; True when it was inside a transaction."""
        with psycopg.connect(self.sink_dsn, autocommit=True) as conn:
            rows = conn.execute(CUT, (proc.name[-63:],)).fetchall()
            for pid, _ in rows:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return any(in_transaction for _, in_transaction in rows)

    def run(self) -> None:
        while len(self.log) < self.faults:
            self.reap()
            while sum(1 for k in self.keys if k not in self.done) < self.width:
                self.new_key()
            time.sleep(self.rng.uniform(0.05, 0.25))
            self.inject()
        end = time.monotonic() + 60
        while self.procs and time.monotonic() < end:
            self.reap()
            time.sleep(0.05)
        for proc in self.procs:  # still running after a minute: counted by the probe
            proc.popen.send_signal(signal.SIGCONT)
            proc.popen.kill()
            proc.popen.wait()

    def probe(self) -> dict[str, str]:
        """A fresh holder acquires each key through the public API; 'held' at the end = wedged."""
        if self.plain:
            return {key: "granted" for key in self.keys}
        outcomes: dict[str, str] = {}
        with LeaseStore(self.lease_dsn, ttl=self.ttl) as store:
            holder = Holder.process("chaos-probe")
            for key in self.keys:
                end = time.monotonic() + 2 * self.ttl + 1
                while True:
                    got = store.acquire(key, holder)
                    if got.outcome is not Outcome.HELD or time.monotonic() > end:
                        break
                    time.sleep(0.2)
                if got.granted:
                    store.release(got.lease, "chaos probe")
                outcomes[key] = "granted" if got.granted else str(got.outcome)
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
) -> dict[str, Any]:
    """Runs one campaign and returns the checker's verdict (also printed, last line JSON).

    Args:
        seed: chooses the schedule.
        faults: how many faults to inject.
        plain: holders without lease and fence (the plugin disabled).
        admin_dsn: the server the campaign's databases are made on.
        private_pg: when > 0, a private server of the campaign's own instead, restarted or
            crashed at most that many times.
    """
    if private_pg <= 0:
        return _campaign(seed, faults, plain, admin_dsn, None, 0)
    datadir = Path(tempfile.gettempdir()) / f"eo-chaos-{uuid.uuid4().hex[:8]}"
    server = EmbeddedPostgres(free_port(), datadir=datadir)
    server.start()
    try:
        return _campaign(seed, faults, plain, server.dsn(), server, private_pg)
    finally:
        server.destroy()


def _campaign(
    seed: int,
    faults: int,
    plain: bool,
    admin_dsn: str,
    server: EmbeddedPostgres | None,
    server_faults: int,
) -> dict[str, Any]:
    with databases(admin_dsn) as (lease_dsn, sink_dsn):
        migrate(lease_dsn)
        migrate(sink_dsn, SINK_FENCE)
        with psycopg.connect(sink_dsn, autocommit=True) as conn:
            conn.execute(EFFECTS)
        run = Campaign(seed, faults, plain, lease_dsn, sink_dsn)
        run.server, run.server_faults_left = server, server_faults
        started = time.monotonic()
        try:
            run.run()
        finally:
            shutil.rmtree(run.tmp, ignore_errors=True)
        log = {
            "mode": "plain" if plain else "fenced",
            "seed": seed,
            "keys": run.keys,
            "faults": run.log,
            "probe": run.probe(),
            "seconds": round(time.monotonic() - started, 1),
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(log, f)
        try:
            checked = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tests.chaos.checker",
                    "--sink-dsn",
                    sink_dsn,
                    "--log",
                    f.name,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            os.unlink(f.name)
    print(checked.stdout, end="")
    if not checked.stdout.strip():
        raise RuntimeError(f"the checker printed nothing:\n{checked.stderr}")
    verdict: dict[str, Any] = json.loads(checked.stdout.strip().splitlines()[-1])
    verdict["seconds"] = log["seconds"]
    print(json.dumps(verdict))
    return verdict


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=10000)
    parser.add_argument("--plain", action="store_true", help="holders without lease and fence")
    parser.add_argument("--dsn", default=os.environ.get("CHAOS_ADMIN_DSN", ADMIN_DSN))
    parser.add_argument(
        "--private-pg",
        type=int,
        default=0,
        metavar="N",
        help="run on a private Postgres of the campaign's own, restarted or crashed up to N times",
    )
    args = parser.parse_args(argv)
    verdict = campaign(
        args.seed, args.faults, plain=args.plain, admin_dsn=args.dsn, private_pg=args.private_pg
    )
    bad = verdict["stale_writes_accepted"] + verdict["items_missed"] + verdict["keys_wedged"]
    return int(bool(bad or (verdict["duplicate_effects"] and not args.plain)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
