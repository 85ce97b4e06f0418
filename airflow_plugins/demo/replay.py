"""``exactly-once-demo``: the billing incident of 2024-02-15, replayed on real Airflow.

Two schedulers with LocalExecutor, an api-server, a dag-processor and a triggerer (real
processes, ``airflow_plugins.demo.stack``) run the ``billing_nightly`` example DAG over 340
customers for business date 2024-02-15. Mid-run, the scheduler that owns the run gets SIGTERM
(a pod eviction; ``--signal SIGKILL`` for a crash); the standby resets the "orphaned" task and
runs it again while the first execution is still charging. This happens twice, on two fresh
deployments: once with the plugin disabled (``[exactly_once] enabled = False``), once enabled.
The charges of both are printed side by side; the last line is one JSON object with the figures.

Postgres: ``--dsn`` (a superuser DSN of a server where databases may be created), else an
embedded PostgreSQL started for the demo (as an unprivileged user when run as root).

``--executor celery`` replays it on CeleryExecutor instead: two ``airflow celery worker``
processes on the machine's Redis (127.0.0.1:6379, a database number of the demo's own). There a
scheduler's death does not stop a try (the standby adopts the Celery task), so the incident's
road is the worker's machine: worker-a, running the billing try, is SIGKILLed with every process
it runs; its message was not acknowledged (``task_acks_late``), the scheduler fails the silent
try after the task heartbeat timeout, and worker-b runs it again from the first customer.

Airflow's failover timeouts are shortened (scheduler health threshold 15 s, orphan check 5 s,
task heartbeat timeout 20 s) so the replay takes minutes, not the incident's four hours.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from airflow_plugins.demo.airflow_api import AirflowApi
from airflow_plugins.demo.celery_workers import CeleryConfig
from airflow_plugins.demo.deployment import BillingDeployment
from airflow_plugins.demo.stack import (
    ADMIN_USER,
    AirflowStack,
    StackError,
    free_port_block,
    wait_until,
)
from airflow_plugins.demo.task_processes import find_task_processes

DAG_ID = "billing_nightly"
TASK_ID = "charge"
BUSINESS_DATE = "2024-02-15"
CUSTOMERS = 340
DEMO_ENV = {
    # only the replayed run: no scheduled run of today's date beside it
    "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
    # 2024-02-15 is older than the default 400-day retention horizon of the lease store
    "AIRFLOW__EXACTLY_ONCE__HORIZON_DAYS": "36500",
}


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """What the billing database holds after one replay."""

    plugin: str
    charges: int
    processor_charges: int
    processor_customers_twice: int
    customers_charged: int
    double_charged: int
    missed: int
    duplicate_cents: int
    tries: int
    run_state: str
    seconds: float

    def as_json(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict."""
        return dataclasses.asdict(self)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _wait_schedulers(stack: AirflowStack, count: int) -> None:
    wait_until(
        lambda: stack.running_jobs().get("SchedulerJob", 0) >= count,
        timeout=120,
        what=f"{count} scheduler(s) heartbeating",
    )


def _charges(deployment: BillingDeployment) -> list[dict[str, Any]]:
    return deployment.charges(BUSINESS_DATE)


def replay_once(
    deployment: BillingDeployment,
    *,
    customers: int,
    delay: float,
    kill_after: int,
    sig: signal.Signals,
    say: Callable[[str], None] = _say,
) -> ReplayResult:
    """Runs the incident on one deployment (databases created, stack not started)."""
    started = time.monotonic()
    label = "enabled" if deployment.enabled else "disabled"
    stack = deployment.create()
    stack.start()
    api = AirflowApi(stack.base_url, ADMIN_USER, stack.passwords[ADMIN_USER])
    on_celery = bool(stack.workers)
    try:
        wait_until(lambda: _parsed(api), timeout=180, what=f"DAG {DAG_ID} parsed")
        # scheduler A (on Celery: worker A) runs the night; B is the standby that joins
        # before A dies
        stack.stop_component("worker-b" if on_celery else "scheduler-b", timeout=20)
        run_id = api.trigger_dag_run(
            DAG_ID,
            {"business_date": BUSINESS_DATE, "charge_delay": delay, "customers": customers},
        )
        say(f"[plugin {label}] 02:00:00 billing run {run_id} started ({customers} customers)")
        api.wait_for_task_state(DAG_ID, run_id, TASK_ID, {"running"}, timeout=240)
        wait_until(
            lambda: len(_charges(deployment)) >= kill_after,
            timeout=240,
            what=f"{kill_after} charges",
        )
        schedulers = [
            c.pid for n, c in stack.components.items() if n.startswith("scheduler") and c.pid
        ]
        procs = find_task_processes(
            deployment.metadata_dsn, DAG_ID, run_id, TASK_ID, scheduler_pids=schedulers
        )
        if on_celery:
            _lose_worker(stack, "worker-a", "worker-b", sig, label, len(_charges(deployment)), say)
            return _result(deployment, api, run_id, label, customers, started, say)
        stack.start_scheduler("scheduler-b")
        _wait_schedulers(stack, 2)
        say(
            f"[plugin {label}] 02:03:14 {sig.name} to scheduler-a (task pid "
            f"{procs.task if procs else '?'}) after {len(_charges(deployment))} charges"
        )
        stack.signal("scheduler-a", sig)
        return _result(deployment, api, run_id, label, customers, started, say)
    finally:
        api.close()


def _lose_worker(
    stack: AirflowStack,
    lost: str,
    standby: str,
    sig: signal.Signals,
    label: str,
    charged: int,
    say: Callable[[str], None],
) -> None:
    """Starts the standby worker, then sends ``sig`` to every process of worker ``lost``
    (its main process, pool processes, supervisors and task processes: its machine is gone)."""
    stack.start_worker(standby)
    wait_until(lambda: stack.worker_ready(standby), timeout=120, what=f"{standby} ready")
    pid = stack.components[lost].pid
    if pid is None:
        raise StackError(f"{lost} is not running")
    main = psutil.Process(pid)
    tree = [main, *main.children(recursive=True)]
    say(
        f"[plugin {label}] 02:03:14 {sig.name} to {lost} and its {len(tree) - 1} processes "
        f"after {charged} charges"
    )
    stack.signal(lost, sig)
    for proc in tree:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _result(
    deployment: BillingDeployment,
    api: AirflowApi,
    run_id: str,
    label: str,
    customers: int,
    started: float,
    say: Callable[[str], None],
) -> ReplayResult:
    run = api.wait_for_run_state(DAG_ID, run_id, timeout=900)
    tries = len(api.task_tries(DAG_ID, run_id, TASK_ID))
    say(f"[plugin {label}] billing run ended {run['state']} after {tries} tries")
    rows = _charges(deployment)
    per_customer = Counter(r["customer"] for r in rows)
    amounts = {r["customer"]: 0 for r in rows}
    from_billing = _amounts(deployment)
    for name, count in per_customer.items():
        amounts[name] = (count - 1) * from_billing.get(name, 0)
    at_processor = Counter(c["customer"] for c in deployment.processor_charges(BUSINESS_DATE))
    return ReplayResult(
        plugin=label,
        charges=len(rows),
        processor_charges=sum(at_processor.values()),
        processor_customers_twice=sum(1 for n in at_processor.values() if n > 1),
        customers_charged=len(per_customer),
        double_charged=sum(1 for n in per_customer.values() if n > 1),
        missed=customers - len(per_customer),
        duplicate_cents=sum(amounts.values()),
        tries=tries,
        run_state=str(run["state"]),
        seconds=round(time.monotonic() - started, 1),
    )


def _parsed(api: AirflowApi) -> bool:
    try:
        api.dag(DAG_ID)
    except Exception:  # not parsed yet: 404
        return False
    return True


def _amounts(deployment: BillingDeployment) -> dict[str, int]:
    import psycopg

    with psycopg.connect(deployment.sink_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT customer, max(amount_cents) FROM billing.charges "
            "WHERE business_date = %s GROUP BY customer",
            (BUSINESS_DATE,),
        ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def side_by_side(without: ReplayResult, with_: ReplayResult) -> str:
    """The two replays as a table."""
    lines = [
        f"{'billing 2024-02-15, ' + str(CUSTOMERS) + ' customers':<34}"
        f"{'plugin disabled':>18}{'plugin enabled':>18}",
        f"{'charges at the payment processor':<34}{without.processor_charges:>18}"
        f"{with_.processor_charges:>18}",
        f"{'  customers charged twice there':<34}{without.processor_customers_twice:>18}"
        f"{with_.processor_customers_twice:>18}",
        f"{'billing rows written':<34}{without.charges:>18}{with_.charges:>18}",
        f"{'customers charged':<34}{without.customers_charged:>18}{with_.customers_charged:>18}",
        f"{'customers charged twice or more':<34}{without.double_charged:>18}"
        f"{with_.double_charged:>18}",
        f"{'customers missed':<34}{without.missed:>18}{with_.missed:>18}",
        f"{'duplicate amount (USD)':<34}{without.duplicate_cents / 100:>18,.2f}"
        f"{with_.duplicate_cents / 100:>18,.2f}",
        f"{'task tries':<34}{without.tries:>18}{with_.tries:>18}",
        f"{'DAG run state':<34}{without.run_state:>18}{with_.run_state:>18}",
    ]
    return "\n".join(lines)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="exactly-once-demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("EXACTLY_ONCE_DEMO_DSN"),
        help="superuser DSN of a Postgres server to use (default: an embedded one)",
    )
    parser.add_argument("--customers", type=int, default=CUSTOMERS)
    parser.add_argument(
        "--delay", type=float, default=0.2, help="seconds per charge (the real run: ~40 s)"
    )
    parser.add_argument(
        "--kill-after", type=int, default=20, help="charges made before the scheduler dies"
    )
    parser.add_argument(
        "--signal",
        choices=("SIGTERM", "SIGKILL"),
        default=None,
        help="sent to scheduler-a (default SIGTERM), or on Celery to worker-a (default SIGKILL)",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "celery"),
        default="local",
        help="LocalExecutor (default), or CeleryExecutor with two workers on Redis 6379",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Replays the incident without and with the plugin; prints both; last line: JSON."""
    args = _arguments(argv)
    sig = signal.Signals[args.signal or ("SIGKILL" if args.executor == "celery" else "SIGTERM")]
    # a stopped demo still stops its Airflow processes and its embedded Postgres (finally:)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    embedded = None
    admin_dsn = args.dsn
    if not admin_dsn:
        from airflow_plugins.demo.embedded_postgres import EmbeddedPostgres

        embedded = EmbeddedPostgres(
            free_port_block(size=1), settings={"max_connections": "300", "fsync": "off"}
        )
        _say(f"starting an embedded PostgreSQL on port {embedded.port} ...")
        admin_dsn = embedded.start().dsn()
    results = []
    try:
        for enabled in (False, True):
            deployment = BillingDeployment(
                admin_dsn,
                enabled=enabled,
                extra_env=DEMO_ENV,
                celery=CeleryConfig() if args.executor == "celery" else None,
            )
            try:
                results.append(
                    replay_once(
                        deployment,
                        customers=args.customers,
                        delay=args.delay,
                        kill_after=args.kill_after,
                        sig=sig,
                    )
                )
            finally:
                deployment.destroy()
    finally:
        if embedded is not None:
            embedded.destroy()
    without, with_ = results
    print(side_by_side(without, with_))
    print(
        json.dumps(
            {
                "business_date": BUSINESS_DATE,
                "customers": args.customers,
                "signal": sig.name,
                "executor": args.executor,
                "without_plugin": without.as_json(),
                "with_plugin": with_.as_json(),
            }
        ),
        flush=True,
    )
    return 0 if with_.double_charged == 0 and with_.missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
