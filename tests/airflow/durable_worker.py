"""Child process of the durable-operator tests: one try that freezes between submit and record.

Runs ``ExactlyOnceSparkSubmit`` (try 1 of the nightly run) against the stand-in job system; right
after the job system accepted the job, before the operator returns its id, the process stops
itself with SIGSTOP. The test lets its lease expire, runs the next try, then resumes it with
SIGCONT. Prints one JSON line: the try's result or its error.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ["AIRFLOW__EXACTLY_ONCE__LEASE_DSN"] = os.environ["EO_LEASE_DSN"]
os.environ["AIRFLOW__EXACTLY_ONCE__HORIZON_DAYS"] = "4000"
os.environ["AIRFLOW__EXACTLY_ONCE__TTL"] = "2"
os.environ["AIRFLOW__EXACTLY_ONCE__HEARTBEAT"] = "0.3"
os.environ["AIRFLOW__EXACTLY_ONCE__ENABLED"] = os.environ["EO_ENABLED"]


def main() -> None:
    """Builds the DAG's task, freezes after its submit, reports how the try ended."""
    from datetime import UTC, datetime

    from airflow.sdk.bases.operator import ExecutorSafeguard

    from tests.airflow.conftest import task_context
    from tests.airflow.durable_jobs import (
        AirflowStateStore,
        ExactlyOnceSparkSubmit,
        JobClient,
        durable_task,
        serve_airflow_store,
    )

    ExecutorSafeguard.test_mode = True
    JobClient.jobs_dsn = os.environ["EO_JOBS_DSN"]
    JobClient.after_submit.append(lambda job_id: os.kill(os.getpid(), signal.SIGSTOP))
    airflow_store = AirflowStateStore(os.environ["EO_JOBS_DSN"])
    serve_airflow_store(airflow_store)
    task = durable_task(ExactlyOnceSparkSubmit)
    context = task_context(task, logical_date=datetime(2024, 2, 15, 2, tzinfo=UTC))
    context["ti"].stats_tags = {}
    context["task_state_store"] = airflow_store.accessor(context)
    try:
        result = task.execute(context)
    except BaseException as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        sys.exit(1)
    print(json.dumps({"result": result}), flush=True)


if __name__ == "__main__":
    main()
