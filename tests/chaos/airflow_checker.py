"""The Airflow campaign's independent checker: billing rows, processor charges, Airflow's states.

It reads what a user would look at: the billing database's ``billing.charges`` rows of each
business date the campaign ran (customer, the writer's token, in commit order per date), the
payment processor's own record of the charges it made (``GET /_processor/charges``, each naming
its business date and customer in its metadata), and, through Airflow's REST API as the admin
user, each triggered DAG run's final state and its charge task's (each map index's, for a charge
mapped per tenant, whose rows are judged per tenant: ``by_run``). It judges the rows and the
charges with the lease-level checker's rules (``tests.chaos.checker.check``: duplicates, stale
writes, missed customers, wedged keys, per fault kind, recovery times) and adds Airflow's side:
every DAG run, first or duplicate, ended ``success``. It does not import the lease package or
the plugin and never reads the lease store or Airflow's database: those are under test.

    CHAOS_AIRFLOW_USER=admin CHAOS_AIRFLOW_PASSWORD=... .venv/bin/python -m \
        tests.chaos.airflow_checker --sink-dsn URL --airflow http://127.0.0.1:PORT --log LOG

Its last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from typing import Any

import httpx
import psycopg

from tests.chaos.checker import check, print_verdict, violations

ROWS = (
    "SELECT id, business_date, customer, token, extract(epoch FROM charged_at)::float8"
    " FROM billing.charges WHERE business_date = ANY(%s) ORDER BY business_date, id"
)
PROCESSOR = "processor"


def processor_charges(url: str, dates: set[str]) -> list[dict[str, Any]]:
    """The processor's charges of ``dates``, in the lease-level checker's shape (its run is
    the business date, its item the customer)."""
    with urllib.request.urlopen(url + "/_processor/charges", timeout=30) as answer:
        made: list[dict[str, Any]] = json.loads(answer.read())
    shaped = []
    for charge in made:
        meta = charge.get("metadata") or {}
        if meta.get("business_date") in dates:
            shaped.append(
                {"metadata": {"run": meta["business_date"]}, "customer": meta["customer"]}
            )
    return shaped


def airflow_states(
    base_url: str, user: str, password: str, dag_id: str, task_id: str, run_ids: list[str]
) -> dict[str, dict[str, str]]:
    """Each run's final state and its task's, as Airflow's REST API shows them."""
    states: dict[str, dict[str, str]] = {}
    with httpx.Client(base_url=base_url, timeout=30.0) as client:
        token = client.post("/auth/token", json={"username": user, "password": password})
        token.raise_for_status()
        headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
        for run_id in run_ids:
            path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}"
            run = client.get(path, headers=headers)
            task = client.get(f"{path}/taskInstances/{task_id}", headers=headers)
            if task.status_code == 404:  # a mapped task: its instances, one per map index
                task = client.get(f"{path}/taskInstances/{task_id}/listMapped", headers=headers)
            answer = task.json() if task.is_success else {}
            tis = answer.get("task_instances", [answer] if answer else [])
            states[run_id] = {
                "run": run.json().get("state", "?")
                if run.is_success
                else f"http {run.status_code}",
                "task": ",".join(sorted({str(ti.get("state")) for ti in tis})) or "?",
                "tries": str(sum(int(ti.get("try_number", 0)) for ti in tis)) if tis else "?",
            }
    return states


def by_run(
    rows: list[tuple[Any, ...]], charges: list[dict[str, Any]], keys: dict[str, list[str]]
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """The rows and charges under the log's runs: a business date, or with a mapped charge
    ``date/tenant``, the tenant whose share (``keys``) holds the customer. Each tenant's charge
    has its own lease and tokens, so its writes are judged apart."""
    run_of = {(key.split("/", 1)[0], item): key for key, items in keys.items() for item in items}
    keyed = [(i, run_of.get((d, c), d), c, token, t) for i, d, c, token, t in rows]
    moved = [
        {**charge, "metadata": {"run": run_of.get((charge["metadata"]["run"], charge["customer"]),
                                                  charge["metadata"]["run"])}}
        for charge in charges
    ]  # fmt: skip
    return keyed, moved


def judge(
    rows: list[tuple[Any, ...]],
    log: dict[str, Any],
    charges: list[dict[str, Any]],
    states: dict[str, dict[str, str]],
) -> dict[str, Any]:
    """The verdict: the rows and charges judged per run and fault kind, and Airflow's side."""
    log = {**log, "processor_keys": dict.fromkeys(log["keys"], PROCESSOR)}
    rows, charges = by_run(rows, charges, log["keys"])
    report = check(rows, log, {PROCESSOR: charges})
    failed = sorted(r for r, s in states.items() if s["run"] != "success")
    runs = log["runs"]
    report.update(
        dag_runs=len(runs),
        duplicate_runs=sum(1 for _, _, duplicate in runs if duplicate),
        dag_runs_not_success=len(failed),
        not_success=[[r, states[r]] for r in failed[:10]],
        charge_tries=sum(int(s["tries"]) for s in states.values() if s["tries"].isdigit()),
        charges=len(rows),
        clear_errors=log.get("clear_errors", [])[:5],
    )
    return report


def bad(report: dict[str, Any]) -> int:
    """How many violations the verdict holds (duplicates included)."""
    return violations(report) + int(report["dag_runs_not_success"])


def assert_billed_once(verdict: dict[str, Any]) -> None:
    """What a campaign with the plugin must show: items charged, none twice at the sink or
    the processor, none missed, no stale write, no wedged key, every DAG run ``success``."""
    zeros = (
        "duplicate_effects",
        "processor_duplicates",
        "processor_items_missed",
        "stale_writes_accepted",
        "items_missed",
        "keys_wedged",
        "dag_runs_not_success",
    )
    seen = {name: verdict[name] for name in zeros if verdict[name]}
    assert verdict["items"] > 0, "the campaign charged nothing"
    assert not seen, f"violations {seen}; runs not success: {verdict['not_success']}"


def main(argv: list[str]) -> int:
    """Prints the per-kind table, then the verdict as one JSON line; exit 1 on any violation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sink-dsn", required=True)
    parser.add_argument("--airflow", required=True, help="the api-server's base URL")
    parser.add_argument("--log", required=True, help="the campaign's JSON log")
    args = parser.parse_args(argv)
    with open(args.log) as f:
        log = json.load(f)
    dates = sorted({key.split("/", 1)[0] for key in log["keys"]})  # a run: date[/tenant]
    with psycopg.connect(args.sink_dsn) as conn:
        rows = conn.execute(ROWS, (dates,)).fetchall()
    charges = processor_charges(log["processor_url"], set(dates))
    states = airflow_states(
        args.airflow,
        os.environ.get("CHAOS_AIRFLOW_USER", "admin"),
        os.environ["CHAOS_AIRFLOW_PASSWORD"],
        log["dag_id"],
        log["task_id"],
        [run_id for run_id, _, _ in log["runs"]],
    )
    report = judge(rows, log, charges, states)
    print_verdict(report)
    return int(bool(bad(report)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
