"""Lease store throughput and latency, measured side by side in one run on one server.

    .venv/bin/python bench/lease_throughput.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
                                               [--quick] [--seconds 5] [--rows 10000000]

In its own database (dropped at the end), with logged tables and ``synchronous_commit`` on, the
same client code (psycopg 3, one connection per client process, autocommit) measures bare
round trips, a bare durable upsert and the lease state changes, at 1 and 4 clients, batch
acquires, and acquire latency in a small and a large lease table. Progress goes to stderr; the
last line of stdout is one JSON object with every figure, ratio and target. What each figure
is: docs/benchmarks.md, "Lease throughput".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore, migrate
from airflow_plugins.lease.queries import query

DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
UPSERT = (
    "INSERT INTO bench_kv (k, v, at) VALUES (%s, %s, now()) "
    "ON CONFLICT (k) DO UPDATE SET v = excluded.v, at = excluded.at"
)
# rows for the latency test: succeeded leases of one business day, inserted in key order (so
# the indexes grow at their ends, as a real store's do over time rather than at random)
LOAD = """
INSERT INTO runlease.lease (key, state, token, holder, attempt, business_date, acquired_at,
                            expires_at, finished_at, result)
SELECT 'load/charge/' || %(day)s::date || '/' || lpad(i::text, 9, '0'), 'succeeded', i,
       '{"engine": "process", "name": "loader"}'::jsonb, 1, %(day)s::date,
       now(), now(), now(), '{"charged": 1}'::jsonb
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
ORDER BY 1
"""
DAYS = 400
TARGETS = {
    "lease_vs_upsert_1": 0.9,
    "lease_vs_upsert_4": 0.9,
    "cycles_per_s_4": 3000.0,
    "batch_leases_per_s": 20000.0,
    "latency_ratio_new_p50": 1.2,
    "latency_ratio_old_p50": 1.2,
}


def log(message: str) -> None:
    """Progress for the person watching (stderr, so stdout ends with the JSON line)."""
    print(message, file=sys.stderr, flush=True)


# -- workloads: each runs in its own client process -------------------------------------------


def _select1(dsn: str, client: int, run: str) -> Callable[[int], int]:
    conn = psycopg.connect(dsn, autocommit=True)

    def op(i: int) -> int:
        conn.execute("SELECT 1").fetchone()
        return 1

    return op


def _upsert(dsn: str, client: int, run: str) -> Callable[[int], int]:
    conn = psycopg.connect(dsn, autocommit=True)

    def op(i: int) -> int:
        # even: a new row, odd: an update of it (as acquire inserts and complete updates)
        conn.execute(UPSERT, (f"{run}/{client}/{i // 2}", i))
        return 1

    return op


def _lease(dsn: str, client: int, run: str) -> Callable[[int], int]:
    store = LeaseStore(dsn, ttl=60, pool_size=1)
    holder = Holder.process(f"bench-{client}")
    today = date.today()
    held: dict[str, Any] = {}

    def op(i: int) -> int:
        if i % 2 == 0:
            got = store.acquire(
                f"lease/{run}/{client}/{i // 2}", holder, business_date=today, input={"n": i}
            )
            held["lease"] = got.lease
        else:
            store.complete(held.pop("lease"), {"charged": i})
        return 1

    return op


def _lease_sql(dsn: str, client: int, run: str) -> Callable[[int], int]:
    conn = psycopg.connect(dsn, autocommit=True)
    holder = Jsonb(Holder.process(f"bench-{client}").to_json())
    acquire, finish = query("acquire"), query("finish")
    today = date.today()
    token: dict[str, int] = {}

    def op(i: int) -> int:
        key = f"sql/{run}/{client}/{i // 2}"
        if i % 2 == 0:
            row = conn.execute(
                acquire,
                {
                    "key": key,
                    "holder": holder,
                    "ttl_ms": 60000,
                    "business_date": today,
                    "horizon_days": 400,
                    "input": Jsonb({"n": i}),
                },
            ).fetchone()
            assert row is not None
            token[key] = row[1]
        else:
            conn.execute(
                finish,
                {
                    "key": key,
                    "token": token.pop(key),
                    "state": "succeeded",
                    "result": Jsonb({"charged": i}),
                    "output": Jsonb({"charged": i}),
                    "error": None,
                    "holder": holder,
                },
            ).fetchone()
        return 1

    return op


def _batch(size: int) -> Callable[[str, int, str], Callable[[int], int]]:
    def make(dsn: str, client: int, run: str) -> Callable[[int], int]:
        store = LeaseStore(dsn, ttl=60, pool_size=1)
        holder = Holder.process(f"bench-batch-{client}")
        today = date.today()

        def op(i: int) -> int:
            keys = [f"batch/{run}/{client}/{i}/t{k:05d}" for k in range(size)]
            got = store.acquire_many(keys, holder, business_date=today)
            assert len(got) == size
            assert all(a.granted for a in got)
            return size

        return op

    return make


WORKLOADS: dict[str, Callable[[str, int, str], Callable[[int], int]]] = {
    "select1": _select1,
    "upsert": _upsert,
    "lease": _lease,
    "lease_sql": _lease_sql,
}


def _client(
    client: int, dsn: str, batch: int, commands: mp.Queue[Any], results: mp.Queue[Any]
) -> None:
    """A client process: builds every workload once, then runs the measurements it is sent."""
    run = uuid.uuid4().hex[:8]
    ops = {kind: make(dsn, client, run) for kind, make in WORKLOADS.items()}
    ops["batch"] = _batch(batch)(dsn, client, run)
    counters = dict.fromkeys(ops, 0)
    results.put(("ready", client, 0, 0.0))
    while (command := commands.get()) is not None:
        kind, start_at, seconds = command
        op = ops[kind]
        done = 0
        while time.time() < start_at:
            time.sleep(0.0005)
        began = time.perf_counter()
        stop = began + seconds
        try:
            while True:
                done += op(counters[kind])
                counters[kind] += 1
                # stop after a complete: no lease is left running between measurements
                if counters[kind] % 2 == 0 and time.perf_counter() >= stop:
                    break
        except Exception as exc:
            results.put(("error", client, 0, f"{kind}: {exc!r}"))
            raise
        results.put((kind, client, done, time.perf_counter() - began))


class Clients:
    """Client processes kept alive across measurements, so kinds can be interleaved cheaply."""

    def __init__(self, dsn: str, count: int, batch: int) -> None:
        ctx = mp.get_context("spawn")
        self._results: mp.Queue[Any] = ctx.Queue()
        self._commands: list[mp.Queue[Any]] = [ctx.Queue() for _ in range(count)]
        self._procs = [
            ctx.Process(target=_client, args=(c, dsn, batch, self._commands[c], self._results))
            for c in range(count)
        ]
        for p in self._procs:
            p.start()
        for _ in self._procs:
            self._results.get(timeout=120)

    def run(self, kind: str, clients: int, seconds: float) -> tuple[int, float]:
        """Runs ``kind`` on the first ``clients`` clients at once; returns (ops, seconds)."""
        start_at = time.time() + 0.2
        for c in range(clients):
            self._commands[c].put((kind, start_at, seconds))
        got = [self._results.get(timeout=seconds * 4 + 120) for _ in range(clients)]
        errors = [detail for what, _, _, detail in got if what == "error"]
        if errors:
            raise RuntimeError(f"a benchmark client failed: {errors}")
        return sum(n for _, _, n, _ in got), max(t for _, _, _, t in got)

    def close(self) -> None:
        """Ends the client processes."""
        for queue in self._commands:
            queue.put(None)
        for p in self._procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def throughput(
    clients: Clients, kinds: list[str], counts: tuple[int, ...], seconds: float, rounds: int
) -> dict[str, float]:
    """Rates per second of every kind at every client count, interleaved round by round.

    Each round runs every (kind, clients) pair for ``seconds / rounds``, so load from outside
    the benchmark falls on all of them alike; a rate is total operations over total time.
    """
    totals: dict[str, list[float]] = {}
    for r in range(rounds):
        for count in counts:
            for kind in kinds:
                ops, elapsed = clients.run(kind, count, seconds / rounds)
                total = totals.setdefault(f"{kind}_per_s_{count}", [0, 0.0])
                total[0] += ops
                total[1] += elapsed
        log(f"  round {r + 1}/{rounds} done")
    rates = {name: ops / elapsed for name, (ops, elapsed) in totals.items()}
    for name, rate in rates.items():
        log(f"  {name:<24} {rate:10.0f}/s")
    return rates


# -- latency at 10k and 10M lease rows --------------------------------------------------------


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "mean_ms": statistics.fmean(ordered) * 1000,
        "p50_ms": at(0.50),
        "p95_ms": at(0.95),
        "p99_ms": at(0.99),
    }


def _year_old_keys(dsn: str, year_ago: date, samples: int) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT key FROM runlease.lease WHERE business_date = %s ORDER BY random() LIMIT %s",
            (year_ago, samples),
        ).fetchall()
    if not rows:
        raise RuntimeError("no year-old lease rows were loaded")
    return [str(r[0]) for r in rows]


def latency(dsns: dict[str, str], samples: int) -> dict[str, dict[str, dict[str, float]]]:
    """Sequential acquire latency of new keys and of year-old (succeeded) keys, per database.

    The databases are sampled in turn, one acquire each, so load from outside the benchmark
    falls on all of them alike.
    """
    year_ago = date.today() - timedelta(days=365)
    today = date.today()
    holder = Holder.process("bench-latency")
    old_keys = {name: _year_old_keys(dsn, year_ago, samples) for name, dsn in dsns.items()}
    times: dict[str, dict[str, list[float]]] = {n: {"new": [], "old": []} for n in dsns}
    stores = {name: LeaseStore(dsn, ttl=60, pool_size=1) for name, dsn in dsns.items()}
    try:
        for store in stores.values():
            store.acquire(f"warmup/{uuid.uuid4().hex}", holder)
        for i in range(samples):
            for name, store in stores.items():
                key = f"new/{i}/{uuid.uuid4().hex[:8]}"
                began = time.perf_counter()
                got = store.acquire(key, holder, business_date=today)
                times[name]["new"].append(time.perf_counter() - began)
                assert got.outcome == "granted", got
                key = old_keys[name][i % len(old_keys[name])]
                began = time.perf_counter()
                got = store.acquire(key, holder, business_date=year_ago)
                times[name]["old"].append(time.perf_counter() - began)
                assert got.outcome == "succeeded", got
    finally:
        for store in stores.values():
            store.close()
    result = {
        name: {kind: _percentiles(t) for kind, t in kinds.items()} for name, kinds in times.items()
    }
    for name, kinds in result.items():
        log(
            f"  latency {name}: new p50 {kinds['new']['p50_ms']:.3f} ms, "
            f"year-old p50 {kinds['old']['p50_ms']:.3f} ms"
        )
    return result


def load_rows(dsn: str, first: int, last: int) -> float:
    """Loads succeeded lease rows numbered ``first..last`` per business day, over 400 days.

    Returns the seconds it took.
    """
    began = time.perf_counter()
    today = date.today()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # a bulk load builds the indexes once, after the rows, rather than row by row: the
        # same indexes (their definitions read back from the catalog) at a fraction of the time
        indexes = [
            str(r[0])
            for r in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = 'runlease' "
                "AND tablename = 'lease' AND indexname <> 'lease_pkey'"
            ).fetchall()
        ]
        # the foreign keys that reference the primary key (task state) go and come back with it
        referencing = [
            (sql.Identifier(str(r[0]), str(r[1])), sql.Identifier(str(r[2])), str(r[3]))
            for r in conn.execute(
                "SELECT n.nspname, t.relname, c.conname, pg_get_constraintdef(c.oid) "
                "FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
                "JOIN pg_namespace n ON n.oid = t.relnamespace "
                "WHERE c.confrelid = 'runlease.lease'::regclass"
            ).fetchall()
        ]
        for table, name, _ in referencing:
            conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, name))
        conn.execute("DROP INDEX " + ", ".join(f"runlease.{_index_name(d)}" for d in indexes))
        conn.execute("ALTER TABLE runlease.lease DROP CONSTRAINT lease_pkey")
        for back in range(DAYS - 1, -1, -1):
            conn.execute(LOAD, {"day": today - timedelta(days=back), "first": first, "last": last})
            if back % 50 == 0:
                log(f"  loaded day -{back}")
        log("  building the indexes")
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute("ALTER TABLE runlease.lease ADD CONSTRAINT lease_pkey PRIMARY KEY (key)")
        for definition in indexes:
            conn.execute(definition.encode())
        for table, name, definition in referencing:
            # the definition is the catalog's own text (pg_get_constraintdef), not input
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(table, name)
                + sql.SQL(definition)  # type: ignore[arg-type]
            )
        conn.execute("VACUUM ANALYZE runlease.lease")
        # write the load out now, not during the measurements that follow
        conn.execute("CHECKPOINT")
    return time.perf_counter() - began


def _index_name(definition: str) -> str:
    # "CREATE [UNIQUE] INDEX name ON ..." as pg_indexes prints it
    return definition.split(" INDEX ", 1)[1].split(" ", 1)[0]


# -- the run ------------------------------------------------------------------------------------


def _server_facts(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        facts: dict[str, Any] = {
            name: str(conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0])  # type: ignore[index]
            for name in (
                "server_version",
                "synchronous_commit",
                "fsync",
                "wal_level",
                "shared_buffers",
            )
        }
        unlogged = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND c.relpersistence <> 'p' "
            "AND (n.nspname = 'runlease' OR c.relname = 'bench_kv')"
        ).fetchone()
    facts["unlogged_tables"] = int(unlogged[0]) if unlogged else -1
    if facts["synchronous_commit"] != "on" or facts["fsync"] != "on" or facts["unlogged_tables"]:
        raise RuntimeError(f"not a durable setup, refusing to measure: {facts}")
    return facts


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def measure(
    dsn: str, small_dsn: str, *, seconds: float, rounds: int, rows: int, batch: int, samples: int
) -> dict[str, Any]:
    """Runs every measurement (``small_dsn``: the 10k-row side of the latency test)."""
    migrate(dsn, LEASE_STORE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_kv (k text PRIMARY KEY, v bigint, at timestamptz)")
    out: dict[str, Any] = {"server": _server_facts(dsn), "seconds_per_measurement": seconds}
    log("throughput (one commit per operation, kinds interleaved):")
    clients = Clients(dsn, 4, batch)
    try:
        rates = throughput(
            clients, ["select1", "upsert", "lease", "lease_sql"], (1, 4), seconds, rounds
        )
        rates.update(throughput(clients, ["batch"], (1, 4), seconds, rounds))
    finally:
        clients.close()
    rates = {k.replace("batch_per_s", "batch_leases_per_s"): v for k, v in rates.items()}
    out["throughput"] = {k: round(v, 1) for k, v in rates.items()}
    out["batch_size"] = batch
    out["cycles_per_s_4"] = round(rates["lease_per_s_4"] / 2, 1)
    # two durable commits per cycle: even a lease as cheap as a bare upsert could not beat this
    out["cycles_ceiling_from_upsert_4"] = round(rates["upsert_per_s_4"] / 2, 1)
    out["batch_leases_per_s"] = round(rates["batch_leases_per_s_1"], 1)

    small = min(10_000, rows // 10)
    log(f"latency with {small:,} and {rows:,} lease rows (loading, this takes a while):")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE runlease.lease CASCADE")
    migrate(small_dsn, LEASE_STORE)
    out["load_seconds_small"] = round(load_rows(small_dsn, 1, small // DAYS), 2)
    out["load_seconds_large"] = round(load_rows(dsn, 1, rows // DAYS), 2)
    at = latency({"small": small_dsn, "large": dsn}, samples)
    at_small, at_large = at["small"], at["large"]
    counts = []
    for each in (small_dsn, dsn):
        with psycopg.connect(each) as conn:
            count = conn.execute("SELECT count(*) FROM runlease.lease").fetchone()
            counts.append(int(count[0]) if count else 0)
            size = conn.execute("SELECT pg_total_relation_size('runlease.lease')").fetchone()
    out["latency"] = {
        "rows_small": counts[0],
        "rows_large": counts[1],
        "lease_table_bytes_large": int(size[0]) if size else 0,
        "small": at_small,
        "large": at_large,
    }
    out["ratios"] = {
        "lease_vs_upsert_1": _ratio(rates["lease_per_s_1"], rates["upsert_per_s_1"]),
        "lease_vs_upsert_4": _ratio(rates["lease_per_s_4"], rates["upsert_per_s_4"]),
        "lease_sql_vs_upsert_1": _ratio(rates["lease_sql_per_s_1"], rates["upsert_per_s_1"]),
        "lease_sql_vs_upsert_4": _ratio(rates["lease_sql_per_s_4"], rates["upsert_per_s_4"]),
        "upsert_vs_select1_1": _ratio(rates["upsert_per_s_1"], rates["select1_per_s_1"]),
        "upsert_vs_select1_4": _ratio(rates["upsert_per_s_4"], rates["select1_per_s_4"]),
        "latency_ratio_new_p50": _ratio(at_large["new"]["p50_ms"], at_small["new"]["p50_ms"]),
        "latency_ratio_old_p50": _ratio(at_large["old"]["p50_ms"], at_small["old"]["p50_ms"]),
        "latency_ratio_new_mean": _ratio(at_large["new"]["mean_ms"], at_small["new"]["mean_ms"]),
        "latency_ratio_old_mean": _ratio(at_large["old"]["mean_ms"], at_small["old"]["mean_ms"]),
    }
    figures = {**out["ratios"], "cycles_per_s_4": out["cycles_per_s_4"],
               "batch_leases_per_s": out["batch_leases_per_s"]}  # fmt: skip
    out["targets"] = {
        name: {
            "value": figures[name],
            "target": ("<= " if name.startswith("latency") else ">= ") + str(target),
            "met": figures[name] <= target
            if name.startswith("latency")
            else figures[name] >= target,
        }
        for name, target in TARGETS.items()
    }
    return out


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; prints the JSON result as the last line of stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN of the server")
    parser.add_argument("--quick", action="store_true", help="short runs, 200k rows")
    parser.add_argument("--seconds", type=float, help="seconds per throughput figure")
    parser.add_argument("--rows", type=int, help="lease rows for the large latency run")
    parser.add_argument("--batch", type=int, help="keys per acquire_many call")
    parser.add_argument("--samples", type=int, help="acquires per latency measurement")
    args = parser.parse_args(argv)
    seconds = args.seconds or (2.0 if args.quick else 10.0)
    rows = args.rows or (200_000 if args.quick else 10_000_000)
    batch = args.batch or (200 if args.quick else 1000)
    samples = args.samples or (200 if args.quick else 2000)
    rounds = 2 if args.quick else 5

    run = uuid.uuid4().hex[:8]
    # the main database, and a second one holding the small lease table for the latency test
    names = [f"bench_lease_{run}", f"bench_lease_{run}_small"]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    # every client session asks for durable commits explicitly
    dsn, small_dsn = (
        psycopg.conninfo.make_conninfo(args.dsn, dbname=name, options="-c synchronous_commit=on")
        for name in names
    )
    began = time.perf_counter()
    try:
        result = measure(
            dsn,
            small_dsn,
            seconds=seconds,
            rounds=rounds,
            rows=rows,
            batch=batch,
            samples=samples,
        )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            for name in names:
                drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                conn.execute(drop.format(sql.Identifier(name)))
    result["quick"] = args.quick
    result["wall_seconds"] = round(time.perf_counter() - began, 1)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
