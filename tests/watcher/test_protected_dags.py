"""Which DAGs the watcher watches, read from a real Airflow's metadata database.

A DAG is watched when it is protected, as the listener judges it: it carries the opt-in tag, or
it has an exactly-once task without the tag (the example billing DAG is one). A scheduled DAG
of plain tasks is not watched, nor a protected DAG that is paused. The DAG files are written
into the watcher's test bundle, with a start date years ahead so the scheduler makes no run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.harness.airflow_harness import AirflowHarness
from tests.watcher.minutely import FOLDER

HEADER = """
from datetime import datetime, timezone

from airflow.sdk import DAG, task

from airflow_plugins.protection.decorators import exactly_once_task
from airflow_plugins.protection.operators import ExactlyOnceOperator

START = datetime(2031, 1, 1, tzinfo=timezone.utc)


def work(fence):
    return {"ok": True}
"""
DAG_FILE = textwrap.dedent(
    """
    with DAG({dag_id!r}, schedule="0 4 * * *", start_date=START, catchup=False, tags={tags!r}):
    {body}
    """
)
BODIES = {
    "operator": '    ExactlyOnceOperator(task_id="charge", python_callable=work)',
    "decorator": (
        '    @exactly_once_task\n    def notify(fence):\n        return {"ok": True}\n    notify()'
    ),
    "plain": "    @task\n    def load():\n        return 1\n    load()",
}
LIST_WATCHED = textwrap.dedent(
    """
    import json
    from datetime import UTC, datetime
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow_plugins.watcher.dags import protected_dags
    reads = []
    get = SerializedDagModel.get
    def counted(*args, **kwargs):
        reads.append(args[0] if args else kwargs.get("dag_id"))
        return get(*args, **kwargs)
    SerializedDagModel.get = counted
    looks = []
    for _ in range(2):
        reads.clear()
        watched = sorted(d.dag_id for d in protected_dags(datetime.now(UTC)))
        looks.append({"watched": watched, "deserialized": sorted(set(reads))})
    print(json.dumps(looks))
    """
)


def _watched(airflow: AirflowHarness) -> list[dict[str, list[str]]]:
    """Two looks' watched DAG ids and the DAGs each look deserialized, from a process
    configured as the watcher would be."""
    done = subprocess.run(
        [sys.executable, "-c", LIST_WATCHED],
        env={**airflow.stack.env(), "PYTHONPATH": str(Path(__file__).parents[2])},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    looks: list[dict[str, list[str]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return looks


@pytest.mark.timeout(600)
def test_the_watcher_watches_every_protected_dag_tagged_or_not(airflow: AirflowHarness) -> None:
    run = uuid.uuid4().hex[:8]
    # kind -> (dag id, tags, body, paused)
    kinds = {
        "operator": (f"w_operator_{run}", [], "operator", False),
        "decorator": (f"w_decorator_{run}", ["team-a"], "decorator", False),
        "tagged": (f"w_tagged_{run}", ["exactly-once"], "plain", False),
        "plain": (f"w_plain_{run}", [], "plain", False),
        "paused": (f"w_paused_{run}", [], "operator", True),
    }
    source = HEADER + "".join(
        DAG_FILE.format(dag_id=dag_id, tags=tags, body=BODIES[body])
        for dag_id, tags, body, _ in kinds.values()
    )
    (FOLDER / f"watched_kinds_{run}.py").write_text(source)
    client = airflow.client()
    for dag_id, _, _, paused in kinds.values():
        airflow.wait_for_dag(dag_id, timeout=240)
        client.set_paused(dag_id, paused)
    try:
        first, second = _watched(airflow)
    finally:
        for dag_id, *_ in kinds.values():
            client.set_paused(dag_id, True)

    ours = {kind: dag_id in first["watched"] for kind, (dag_id, *_) in kinds.items()}
    assert ours == {
        "operator": True,  # an ExactlyOnceOperator, no tag
        "decorator": True,  # an @exactly_once_task, another tag
        "tagged": True,  # plain tasks, the opt-in tag (the policy protects them)
        "plain": False,
        "paused": False,
    }
    assert kinds["operator"][0] in first["deserialized"]
    # the next look finds the same from the kept deserialized versions: no DAG read again
    assert second["watched"] == first["watched"]
    assert not {dag_id for dag_id, *_ in kinds.values()} & set(second["deserialized"])
