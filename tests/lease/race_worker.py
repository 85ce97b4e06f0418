"""One of the racing processes of ``test_race.py`` (run as a script, a real OS process).

It walks the shared keys (the same order as every racer, lightly shuffled, so racers collide),
acquires each, and: completes it after a short random piece of work; or fails it (the next
acquire is granted again); or deliberately lets it expire (it stops renewing, comes back after
the TTL and tries to complete, which must fail if another process took the key over).
It stops when it has seen every key succeeded, and prints a JSON summary as its last line.

    race_worker.py DSN WORKER KEYS TTL START_AT SEED
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from airflow_plugins.lease import Holder, Lease, LeaseLost, LeaseStore, Outcome


def _walk(keys: list[str], rng: random.Random) -> list[str]:
    window = 16
    order: list[str] = []
    for i in range(0, len(keys), window):
        chunk = keys[i : i + window]
        rng.shuffle(chunk)
        order.extend(chunk)
    return order


def main(argv: list[str]) -> int:
    dsn, worker, nkeys, ttl, start_at, seed = argv
    rng = random.Random(int(seed))
    keys = [f"race/charge/2024-02-15/k{i:04d}" for i in range(int(nkeys))]
    lease_ttl = float(ttl)
    done: set[str] = set()
    zombies: list[tuple[float, Lease]] = []
    tally = {"completed": 0, "failed": 0, "zombies": 0, "zombie_completed": 0, "zombie_lost": 0}
    grants = 0
    while time.time() < float(start_at):
        time.sleep(0.001)
    with LeaseStore(dsn, ttl=lease_ttl, pool_size=1) as store:
        while len(done) < len(keys):
            for key in _walk([k for k in keys if k not in done], rng):
                _settle(store, zombies, done, tally)
                grants += 1
                holder = Holder.process(f"racer-{worker}#{grants}")
                got = store.acquire(key, holder)
                if got.outcome is Outcome.SUCCEEDED:
                    done.add(key)
                elif got.granted:
                    _work(store, got.lease, rng, zombies, done, tally, worker)
            if len(done) < len(keys):
                time.sleep(0.01)
        while zombies:
            _settle(store, zombies, done, tally, wait=True)
    print(json.dumps({"worker": worker, "pid": os.getpid(), **tally}))
    return 0


def _work(
    store: LeaseStore,
    lease: Lease,
    rng: random.Random,
    zombies: list[tuple[float, Lease]],
    done: set[str],
    tally: dict[str, int],
    worker: str,
) -> None:
    roll = rng.random()
    if roll < 0.04:
        # stops renewing: comes back after the TTL as a zombie, late enough that another
        # racer's walk reaches the expired key first (with 0.3-1.0 s, none did once in CI)
        zombies.append((time.monotonic() + lease.ttl + rng.uniform(1.0, 3.0), lease))
        tally["zombies"] += 1
        return
    time.sleep(rng.uniform(0, 0.002))
    if roll < 0.08:
        store.fail(lease, "random failure")
        tally["failed"] += 1
        return
    store.complete(lease, {"by": worker, "token": lease.token})
    tally["completed"] += 1
    done.add(lease.key)


def _settle(
    store: LeaseStore,
    zombies: list[tuple[float, Lease]],
    done: set[str],
    tally: dict[str, int],
    *,
    wait: bool = False,
) -> None:
    now = time.monotonic()
    for due, lease in list(zombies):
        if due > now:
            if wait:
                time.sleep(due - now)
            else:
                continue
        zombies.remove((due, lease))
        try:
            store.complete(lease, {"by": "zombie", "token": lease.token})
        except LeaseLost:
            tally["zombie_lost"] += 1
        else:
            tally["zombie_completed"] += 1
            tally["completed"] += 1
            done.add(lease.key)
        return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
