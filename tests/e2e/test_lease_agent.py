"""The lease agent on real Airflow, killed with SIGKILL while billing runs through it.

The session's stack names an agent socket (``[exactly_once] agent_socket``) for every test.
No agent listens there except during this test, so every other scenario's tries find nobody
and connect to the lease store themselves: the whole suite runs that fallback. Here an agent
serves the shared lease store; the protected billing task takes its lease through it, the
agent is killed mid-run, and the try's renewals and its completion connect themselves: the
lease is never lost, no second try starts, every customer is charged exactly once.
"""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import pytest

from airflow_plugins.lease.agent_client import AgentClient
from tests.e2e.billing_runs import (
    assert_exactly_once,
    audit,
    describe_audit,
    finish,
    start_all,
    tally,
    tries,
    wait_charging,
)
from tests.harness.airflow_harness import EXTRA_ENV, AirflowHarness, wait_for
from tests.lease.agent_process import AgentProcess

SOCKET = Path(tempfile.mkdtemp(prefix="eo-e2e-agent-")) / "agent.sock"
EXTRA_ENV["AIRFLOW__EXACTLY_ONCE__AGENT_SOCKET"] = str(SOCKET)
DELAY = 0.05  # 340 customers: about 17 s of charging, several renewals on each side of the kill


def _served(lease_dsn: str) -> int:
    answer = AgentClient(str(SOCKET), lease_dsn, timeout=10).status()
    assert answer is not None, "the agent does not serve the harness's lease store"
    return int(answer["served"])


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_lease_agent_killed_mid_run_loses_no_lease_and_charges_no_one_twice(
    airflow: AirflowHarness,
) -> None:
    agent = AgentProcess(airflow.lease_dsn, SOCKET)
    try:
        run = start_all(airflow, DELAY, ["protected"])["protected"]
        wait_charging(airflow, [run], at_least=40)
        # the try's acquire and its renewals so far went through the agent
        wait_for(lambda: _served(airflow.lease_dsn) >= 2, timeout=30, what="the agent to serve")
        agent.signal(signal.SIGKILL)
        agent.proc.wait(timeout=30)
        killed_at = tally(airflow, run.business_date).rows
        assert killed_at < 340, "the run ended before the agent was killed"

        final = finish(airflow, [run], timeout=300)["protected"]
    finally:
        agent.stop()

    trail = audit(airflow, run)
    assert final["state"] == "success", describe_audit(trail)
    got = assert_exactly_once(airflow, run)
    assert tries(airflow, run) == 1, describe_audit(trail)
    assert len(got.tokens) == 1, got.summary()  # one holder, its lease never lost
    events = [(r["event"], r["outcome"]) for r in trail if r["event"] in ("acquire", "complete")]
    assert events == [("acquire", "granted"), ("complete", "succeeded")], describe_audit(trail)
