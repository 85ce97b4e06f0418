"""Billing runs of the scenarios: start the four variants at once, then count charges.

Each scenario runs the same fault against four DAGs at the same time, each on its own business
date (so their charges and leases never mix):

* ``protected``   ``billing_nightly`` (dags/): ``ExactlyOnceOperator``, fenced sink writes;
* ``unprotected`` its twin with protection off (what ``[exactly_once] enabled = False`` runs);
* ``tagged``      a plain resumable ``@task`` protected only by the cluster policy (tag);
* ``untagged``    the same task without the tag.

The assertions are about rows in the billing database: 340 customers, each charged exactly
once, none missed; or, for the unprotected twins, the duplicates that plain Airflow makes. The
two variants that bill through the payment processor (``protected``, ``unprotected``) are also
counted where the incident counted them: the charges the processor made.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import Any

from tests.harness.airflow_harness import AirflowHarness, wait_for

CUSTOMERS = 340
TASK = "charge"
VARIANTS = {
    "protected": "billing_nightly",
    "unprotected": "billing_nightly_unprotected",
    "tagged": "billing_nightly_tagged",
    "untagged": "billing_nightly_untagged",
}
PROTECTED = ("protected", "tagged")
UNPROTECTED = ("unprotected", "untagged")
# the variants whose charge task bills through the payment processor (charge_at_processor);
# the tagged/untagged ones write billing rows only
AT_PROCESSOR = ("protected", "unprotected")


@dataclasses.dataclass(frozen=True)
class BillingRun:
    """One triggered billing DAG run."""

    variant: str
    dag_id: str
    run_id: str
    business_date: str

    @property
    def key(self) -> str:
        """The lease key of its charge task."""
        return f"{self.dag_id}/{TASK}/{self.business_date}"


@dataclasses.dataclass(frozen=True)
class Tally:
    """The charges of one business date, as finance would count them."""

    rows: int
    per_customer: dict[str, int]
    writers: dict[str, int]
    tokens: dict[int, int]

    @property
    def charged_customers(self) -> int:
        """Customers charged at least once."""
        return len(self.per_customer)

    @property
    def double_charged(self) -> int:
        """Customers charged more than once."""
        return sum(1 for n in self.per_customer.values() if n > 1)

    @property
    def missing(self) -> int:
        """Customers never charged."""
        return CUSTOMERS - self.charged_customers

    def summary(self) -> str:
        """One line for logs and assertion messages."""
        return (
            f"{self.rows} charges, {self.charged_customers} customers, "
            f"{self.double_charged} charged twice or more, {self.missing} missed; "
            f"by writer {self.writers}; by token {self.tokens}"
        )


def trigger(airflow: AirflowHarness, variant: str, business_date: str, delay: float) -> BillingRun:
    """Triggers one billing run of ``variant`` for ``business_date``."""
    dag_id = VARIANTS[variant]
    run_id = airflow.trigger_dag_run(
        dag_id, {"business_date": business_date, "charge_delay": delay}
    )
    return BillingRun(variant, dag_id, run_id, business_date)


def start_all(
    airflow: AirflowHarness, delay: float, variants: Iterable[str] = VARIANTS
) -> dict[str, BillingRun]:
    """Triggers every variant at once, each on a fresh business date."""
    return {v: trigger(airflow, v, airflow.fresh_business_date(), delay) for v in variants}


def tally(airflow: AirflowHarness, business_date: str) -> Tally:
    """Counts the charges of ``business_date`` in the billing database."""
    rows = airflow.charges(business_date)
    return Tally(
        rows=len(rows),
        per_customer=dict(collections.Counter(r["customer"] for r in rows)),
        writers=dict(collections.Counter(r["writer"].split("/")[-1] for r in rows)),
        tokens=dict(collections.Counter(int(r["token"]) for r in rows)),
    )


def wait_charging(
    airflow: AirflowHarness, runs: Iterable[BillingRun], *, at_least: int, timeout: float = 150
) -> None:
    """Waits until every run has charged at least ``at_least`` customers (mid-run)."""
    for run in runs:
        wait_for(
            lambda run=run: tally(airflow, run.business_date).rows >= at_least,
            timeout=timeout,
            what=f"{run.variant} to charge {at_least} customers",
        )


def finish(
    airflow: AirflowHarness, runs: Iterable[BillingRun], *, timeout: float = 300
) -> dict[str, dict[str, Any]]:
    """Waits until every run ended; returns variant -> final DAG run."""
    return {
        run.variant: airflow.wait_for_run_state(run.dag_id, run.run_id, timeout=timeout)
        for run in runs
    }


def tries(airflow: AirflowHarness, run: BillingRun) -> int:
    """How many tries the run's charge task took."""
    return len(airflow.task_tries(run.dag_id, run.run_id, TASK))


def processor_tally(airflow: AirflowHarness, business_date: str) -> collections.Counter[str]:
    """Charges the payment processor made for ``business_date``, per customer."""
    return collections.Counter(
        c["metadata"]["customer"] for c in airflow.processor_charges(business_date)
    )


def assert_exactly_once(airflow: AirflowHarness, run: BillingRun) -> Tally:
    """Every customer charged once for the run's date: no duplicate, none missed (in the
    billing table, and at the processor for a variant billing through it)."""
    got = tally(airflow, run.business_date)
    assert got.double_charged == 0, f"{run.variant}: {got.summary()}"
    assert got.missing == 0, f"{run.variant}: {got.summary()}"
    assert got.rows == CUSTOMERS, f"{run.variant}: {got.summary()}"
    if run.variant in AT_PROCESSOR:
        at = processor_tally(airflow, run.business_date)
        twice = sorted(c for c, n in at.items() if n > 1)
        assert sum(at.values()) == CUSTOMERS, f"{run.variant}: processor charged twice {twice}"
        assert set(at) == set(got.per_customer), f"{run.variant}: processor missed some"
    return got


def assert_double_charged(airflow: AirflowHarness, run: BillingRun) -> Tally:
    """Plain Airflow's harm shows: some customers charged twice (and none missed), at the
    processor too for a variant billing through it."""
    got = tally(airflow, run.business_date)
    assert got.double_charged > 0, f"{run.variant} did not double-charge: {got.summary()}"
    assert got.missing == 0, f"{run.variant}: {got.summary()}"
    if run.variant in AT_PROCESSOR:
        at = processor_tally(airflow, run.business_date)
        # every duplicate row is a second call; a call whose row was lost is one more
        assert sum(1 for n in at.values() if n > 1) >= got.double_charged, at
        assert len(at) == CUSTOMERS, f"{run.variant}: processor missed some"
    return got


def audit(airflow: AirflowHarness, run: BillingRun) -> list[dict[str, Any]]:
    """The lease store's audit trail of the run's key, oldest first."""
    with airflow.lease_store() as store:
        return store.history(run.key)


def describe_audit(rows: Iterable[dict[str, Any]]) -> str:
    """The audit trail as lines: event, outcome, token, holder's run and try."""
    lines = []
    for row in rows:
        holder = row.get("holder") or {}
        lines.append(
            f"{row['event']:<12} {row.get('outcome') or '':<12} token={row.get('token')} "
            f"run={holder.get('run_id')} try={holder.get('try_number')} pid={holder.get('pid')}"
        )
    return "\n".join(lines)


def outcomes(rows: Iterable[dict[str, Any]]) -> list[str]:
    """``event:outcome`` of each audit row, in order."""
    return [f"{r['event']}:{r.get('outcome')}" for r in rows]
