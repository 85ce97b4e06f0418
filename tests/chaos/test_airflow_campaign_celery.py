"""The CI slice of the Airflow-level campaign on CeleryExecutor: a fixed seed, one real Airflow
3.3 stack with two ``airflow celery worker`` processes on a Redis of its own (``CeleryHarness``),
the demo payment processor.

Every task reaches the lease store through one lease agent (the two workers share the host).
With the plugin, the Celery worker running a charge SIGKILLed with its whole process tree (a
worker machine lost; started again 15 s later) or stopped past the lease, the agent SIGKILLed
or stopped, besides task kills, a scheduler kill and clears: the independent checker finds
every customer charged once in the billing table and at the processor, none missed, no stale
write, no wedged key, every DAG run ``success``. With the plugin disabled, worker kills alone
make it find customers charged twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.chaos.airflow_campaign import ChaosStack, campaign, chaos_stack
from tests.chaos.airflow_checker import assert_billed_once

SEED = 2
FAULTS = 16
KINDS = (
    "worker_sigkill",
    "worker_sigstop_past_lease",
    "agent_sigkill",
    "agent_sigstop",
    "task_sigkill",
    "supervisor_sigkill",
    "scheduler_sigkill",
    "clear",
    "duplicate_trigger",
)

pytestmark = [pytest.mark.celery]


@pytest.fixture(scope="module")
def stack() -> Iterator[ChaosStack]:
    with chaos_stack(executor="celery", agent=True) as running:
        yield running


@pytest.mark.timeout(420)
def test_fenced_billing_on_celery_workers_under_faults_charges_every_customer_once(
    stack: ChaosStack,
) -> None:
    verdict: dict[str, Any] = campaign(stack, SEED, FAULTS, plain=False, kinds=KINDS)
    assert verdict["faults_injected"] == FAULTS
    by_fault = verdict["by_fault"]
    worker_faults = sum(by_fault.get(k, {}).get("landed", 0) for k in KINDS[:2])
    assert worker_faults > 0, f"no Celery worker fault landed: {sorted(by_fault)}"
    agent_faults = sum(by_fault.get(k, {}).get("landed", 0) for k in KINDS[2:4])
    assert agent_faults > 0, f"no lease agent fault landed: {sorted(by_fault)}"
    assert verdict["agent_served"] > 0, "the tries did not reach the store through the agent"
    assert_billed_once(verdict)


@pytest.mark.timeout(300)
def test_the_checker_finds_double_charges_after_worker_kills_with_the_plugin_disabled(
    stack: ChaosStack,
) -> None:
    verdict: dict[str, Any] = campaign(
        stack, SEED, 3, plain=True, kinds=("worker_sigkill",), customers=12
    )
    assert verdict["faults_landed"] > 0
    assert verdict["duplicate_effects"] > 0
    assert verdict["processor_duplicates"] > 0
