"""The CI slice of the Airflow-level campaign: a fixed seed, one real Airflow 3.3 stack (two
schedulers on LocalExecutor, api-server, dag-processor, triggerer, on Postgres), the demo
payment processor.

With the plugin (task processes and supervisors SIGKILLed, stopped within and past the lease,
a scheduler SIGKILLed with the other standing by, the charge cleared, marked failed and
re-run, its business date triggered twice, the routes to the lease store and the billing
database reset and black-holed, billing sessions ended, the store's own Postgres restarted or
crashed once), and again with the charge mapped per tenant, the independent checker finds every
customer charged once in the billing table and at the processor, none missed, no stale write,
no wedged key, every DAG run ended ``success``; with the plugin disabled (the same charge
without lease, fence and idempotency key) the same checker finds customers charged twice, so
it is shown to catch them. Each seed that once found a failure stays here as a regression
case, with what it found.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.chaos.airflow_campaign import ChaosStack, campaign, chaos_stack
from tests.chaos.airflow_checker import assert_billed_once

SEED = 1
FAULTS = 14


@pytest.fixture(scope="module")
def stack() -> Iterator[ChaosStack]:
    # the lease store and billing on a server of their own: one fault restarts or crashes it
    with chaos_stack(private_pg=True) as running:
        yield running


@pytest.mark.timeout(420)
def test_fenced_billing_runs_under_faults_charge_every_customer_once(
    stack: ChaosStack,
) -> None:
    verdict: dict[str, Any] = campaign(stack, SEED, FAULTS, plain=False, server_faults=1)
    assert verdict["faults_injected"] == FAULTS
    assert verdict["faults_landed"] > 0
    assert_billed_once(verdict)


@pytest.mark.timeout(300)
def test_a_charge_mapped_per_tenant_charges_every_customer_once_under_faults(
    stack: ChaosStack,
) -> None:
    """``chaos_billing_mapped``: the charge mapped over four tenants, each a lease of its own
    (keyed by tenant), a tenant's try cleared, marked failed, killed or stopped alone."""
    kinds = ("task_sigkill", "sigstop_past_lease", "mark_failed", "clear", "duplicate_trigger")
    verdict: dict[str, Any] = campaign(
        stack, SEED, 8, plain=False, mapped=True, kinds=kinds, customers=12
    )
    assert verdict["faults_injected"] == 8
    assert verdict["faults_landed"] > 0
    assert verdict["runs"] % 4 == 0  # a run per tenant and business date
    assert_billed_once(verdict)


@pytest.mark.timeout(300)
def test_the_checker_finds_double_charges_with_the_plugin_disabled(
    stack: ChaosStack,
) -> None:
    verdict: dict[str, Any] = campaign(
        stack, SEED, 6, plain=True, kinds=("task_sigkill", "supervisor_sigkill"), customers=12
    )
    assert verdict["faults_landed"] > 0
    assert verdict["duplicate_effects"] > 0
    assert verdict["processor_duplicates"] > 0
