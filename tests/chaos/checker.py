"""The campaign's independent checker: judges a run from what a user would look at.

It reads the sink's business rows (``effects``: one per item written, with the writer's token,
in commit order per key, since writes of a key serialise on its fence row), the expected items
of each key, the campaign's fault log (what was injected, when, at which key) and the probe
results (a fresh holder process acquiring each key through the public API after the faults)
and the holders still at work a minute after the faults ended (a try that never ends: a user
sees it running forever).
For the keys charged at a payment processor it reads the processor's own record of its charges
(``GET /_processor/charges``, every charge it made, each naming its run and customer item in its
metadata) and counts items charged more than once at the processor and items never charged.
It does not import the lease package and never reads the lease store: that is what is under test.

    .venv/bin/python -m tests.chaos.checker --sink-dsn URL --log campaign.json

Its last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import urllib.request
from collections import defaultdict
from typing import Any

import psycopg

ROWS = (
    "SELECT id, key, item, token, extract(epoch FROM written_at)::float8"
    " FROM effects ORDER BY key, id"
)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def processor_charges(log: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every charge each of the run's processors made (processor name -> its charges)."""
    charges: dict[str, list[dict[str, Any]]] = {}
    for name, url in log.get("processors", {}).items():
        with urllib.request.urlopen(url + "/_processor/charges", timeout=30) as answer:
            charges[name] = json.loads(answer.read())
    return charges


def _at_processor(
    log: dict[str, Any], charges: dict[str, list[dict[str, Any]]]
) -> tuple[dict[str, int], dict[str, int]]:
    """Per processor key: items charged more than once (one count per extra charge), and
    items never charged, at the processor the key's holders charge at."""
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for name, made in charges.items():
        for charge in made:
            meta = charge.get("metadata") or {}
            counts[(name, str(meta.get("run")), str(charge.get("customer")))] += 1
    duplicates: dict[str, int] = {}
    missed: dict[str, int] = {}
    for key, name in log.get("processor_keys", {}).items():
        per_item = [counts.get((name, key, item), 0) for item in log["keys"][key]]
        duplicates[key] = sum(n - 1 for n in per_item if n > 1)
        missed[key] = sum(1 for n in per_item if n == 0)
    return duplicates, missed


def check(
    rows: list[tuple[Any, ...]],
    log: dict[str, Any],
    charges: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The verdict over one campaign's rows, processor charges and log (per kind, in total)."""
    at_duplicates, at_missed = _at_processor(log, charges or {})
    per_key: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        per_key[row[1]].append(row)
    duplicates: dict[str, int] = {}
    stale: dict[str, int] = {}
    missed: dict[str, int] = {}
    for key, items in log["keys"].items():
        seen: dict[str, int] = defaultdict(int)
        highest = 0
        stale[key] = 0
        for _, _, item, token, _ in per_key.get(key, []):
            seen[item] += 1
            if token < highest:
                stale[key] += 1  # accepted after a higher token had written under the key
            highest = max(highest, token)
        duplicates[key] = sum(n - 1 for n in seen.values() if n > 1)
        missed[key] = sum(1 for item in items if seen.get(item, 0) == 0)
    wedged = {
        key: int(outcome not in ("succeeded", "granted")) for key, outcome in log["probe"].items()
    }
    kinds: dict[str, dict[str, Any]] = {}
    recover: dict[str, list[float]] = defaultdict(list)
    for fault in log["faults"]:
        kind = fault["kind"]
        k = kinds.setdefault(kind, {"injected": 0, "landed": 0, "window": 0, "keys": set()})
        k["injected"] += 1
        k["landed"] += int(fault["landed"])
        k["window"] += int(bool(fault.get("window")) and bool(fault["landed"]))
        k["keys"].add(fault["key"])
        later = [r[4] for r in per_key.get(fault["key"], []) if r[4] > fault["t"]]
        if fault["landed"] and later:
            recover[kind].append(min(later) - fault["t"])
    report: dict[str, Any] = {"by_fault": {}}
    for kind, k in sorted(kinds.items()):
        keys = k["keys"] & set(log["keys"])  # a fault that hit while no run was at work: none
        report["by_fault"][kind] = {
            "injected": k["injected"],
            "landed": k["landed"],
            "runs": len(keys),
            "items": sum(len(log["keys"][key]) for key in keys),
            "duplicate_effects": sum(duplicates[key] for key in keys),
            "stale_writes_accepted": sum(stale[key] for key in keys),
            "items_missed": sum(missed[key] for key in keys),
            "keys_wedged": sum(wedged.get(key, 0) for key in keys),
            "landed_in_call_window": k["window"],
            "processor_runs": sum(1 for key in keys if key in at_duplicates),
            "processor_duplicates": sum(at_duplicates.get(key, 0) for key in keys),
            "processor_items_missed": sum(at_missed.get(key, 0) for key in keys),
            "recover_p50_s": _pct(recover[kind], 0.5),
            "recover_p99_s": _pct(recover[kind], 0.99),
        }
    all_recover = [v for values in recover.values() for v in values]
    report.update(
        mode=log["mode"],
        seed=log["seed"],
        runs=len(log["keys"]),
        items=sum(len(items) for items in log["keys"].values()),
        faults_injected=len(log["faults"]),
        faults_landed=sum(int(f["landed"]) for f in log["faults"]),
        # faults counted under no run (one that hit while none was at work), so none is lost
        faults_unattributed=sum(1 for f in log["faults"] if f["key"] not in log["keys"]),
        duplicate_effects=sum(duplicates.values()),
        stale_writes_accepted=sum(stale.values()),
        items_missed=sum(missed.values()),
        keys_wedged=sum(wedged.values()),
        holders_stuck=len(log.get("stuck", [])),
        holders_gave_up=int(log.get("gave_up", 0)),  # past their limit on a key, then retried
        processor_runs=len(at_duplicates),
        processor_items=sum(len(log["keys"][key]) for key in at_duplicates),
        processor_charges=sum(len(made) for made in (charges or {}).values()),
        processor_duplicates=sum(at_duplicates.values()),
        processor_items_missed=sum(at_missed.values()),
        faults_in_call_window=sum(
            int(bool(f.get("window")) and bool(f["landed"])) for f in log["faults"]
        ),
        recover_p50_s=_pct(all_recover, 0.5),
        recover_p99_s=_pct(all_recover, 0.99),
        recover_mean_s=round(statistics.fmean(all_recover), 3) if all_recover else None,
    )
    return report


def violations(report: dict[str, Any]) -> int:
    """The violations every campaign's verdict counts: duplicates (at the sink and the
    processor), stale writes, missed items (both places), wedged keys, holders stuck."""
    return int(
        report["duplicate_effects"]
        + report["stale_writes_accepted"]
        + report["items_missed"]
        + report["keys_wedged"]
        + report["processor_duplicates"]
        + report["processor_items_missed"]
        + report["holders_stuck"]
    )


def print_verdict(report: dict[str, Any]) -> None:
    """Prints one line per fault kind, then the verdict as one JSON line."""
    for kind, figures in report["by_fault"].items():
        print(kind, json.dumps(figures))
    print(json.dumps(report))


def main(argv: list[str]) -> int:
    """Prints the per-kind table, then the verdict as one JSON line; exit 1 on any violation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sink-dsn", required=True)
    parser.add_argument("--log", required=True, help="the campaign's JSON log")
    args = parser.parse_args(argv)
    with open(args.log) as f:
        log = json.load(f)
    with psycopg.connect(args.sink_dsn) as conn:
        rows = conn.execute(ROWS).fetchall()
    report = check(rows, log, processor_charges(log))
    print_verdict(report)
    return int(bool(violations(report)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
