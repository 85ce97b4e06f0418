"""Child process of the self-fencing test: runs a policy-wrapped BashOperator under a lease.

Started as a process-group leader, as Airflow's supervisor starts task processes. It never
ends by itself: the test force-releases its lease and expects it to be SIGKILLed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ["AIRFLOW__EXACTLY_ONCE__LEASE_DSN"] = os.environ["EO_LEASE_DSN"]
os.environ["AIRFLOW__EXACTLY_ONCE__HORIZON_DAYS"] = "4000"
os.environ["AIRFLOW__EXACTLY_ONCE__TTL"] = "3"
os.environ["AIRFLOW__EXACTLY_ONCE__HEARTBEAT"] = "0.3"


def main() -> None:
    """Builds the tagged DAG, wraps its task as the policy does, and runs it."""
    from datetime import UTC, datetime

    import pendulum
    from airflow.providers.standard.operators.bash import BashOperator
    from airflow.sdk import DAG
    from airflow.sdk.bases.operator import ExecutorSafeguard

    from airflow_plugins.protection import policy
    from tests.airflow.conftest import task_context

    ExecutorSafeguard.test_mode = True
    with DAG(
        "self_fence",
        schedule="0 2 * * *",
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        tags=["exactly-once"],
    ):
        task = BashOperator(task_id="bash", bash_command=f"sleep {os.environ['EO_SLEEP']}")
    policy.task_policy(task)
    assert policy.is_wrapped(task)
    context = task_context(task, logical_date=datetime(2024, 2, 15, 2, tzinfo=UTC))
    task.execute(context=context)
    print("the task finished: self-fencing did not happen", flush=True)


if __name__ == "__main__":
    main()
