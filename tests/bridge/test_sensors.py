"""Sensors in the DAG-run workflow on the real Temporal dev server: pokes are activities, the
waits between them durable timers, outcomes Airflow's (``semantics_dags/sensor_waits.py``; the
corpus truth check compares the same DAG with Airflow's run of it)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import date, timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.in_airflow.translate import translate
from bridge.sensor_wait import next_poke_s
from bridge.spec import DagRunInput, SensorSpec
from bridge.worker.catalog import TaskCatalog
from bridge.worker.workflows import DagRunWorkflow
from tests.bridge.conftest import running_worker
from tests.bridge.corpus import dag_bag
from tests.bridge.test_corpus_truth import _result_of

SEMANTICS = Path(__file__).parent / "semantics_dags"


def test_sensors_poke_on_durable_timers_and_end_as_in_airflow(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    dag = dag_bag(SEMANTICS)["sensor_waits"]
    spec = translate(dag).spec
    assert spec is not None
    catalog = TaskCatalog(str(SEMANTICS))
    catalog.load()
    day = (date.today() - timedelta(days=1 + uuid.uuid4().int % 300)).isoformat()
    wid = f"sensor_waits/{day}/{uuid.uuid4().hex[:6]}"

    async def scenario() -> tuple[dict[str, tuple[str, object]], dict[str, int], int]:
        async with running_worker(config, lease_store, catalog) as client:
            handle = await client.start_workflow(
                DagRunWorkflow.run,
                DagRunInput(spec, day, source="test"),
                id=wid,
                task_queue=config.task_queue(spec.lane),
            )
            result = await _result_of(client, wid)
            try:
                await handle.result()
            except WorkflowFailureError:
                pass
            events = (await handle.fetch_history()).events
        pokes: dict[str, int] = {}
        for event in events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == "bridge.poke_sensor":
                    (poke,) = await client.data_converter.decode(attrs.input.payloads)
                    task_id = poke["task"]["task"]["task_id"]
                    pokes[task_id] = pokes.get(task_id, 0) + 1
        timers = sum(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in events)
        outcomes = {t: (o.status, o.result) for t, o in result.tasks.items()}
        return outcomes, pokes, timers

    outcomes, pokes, timers = asyncio.run(scenario())
    assert outcomes == {
        "third_poke": ("succeeded", "fired on poke 3"),
        "after": ("succeeded", "after: fired on poke 3"),
        "fails_hard": ("failed", None),
        "fails_soft": ("skipped", None),
        "skips": ("skipped", None),
        "returns_value": ("succeeded", {"rows": 3}),
        "times_out": ("failed", None),
        "times_out_soft": ("skipped", None),
        "moment_passed": ("succeeded", None),
    }
    # one poke a second until the third fired; the timed-out ones poked on till 2 s had passed
    # (how often depends on how long a poke takes on a loaded machine, in Airflow too)
    assert pokes["third_poke"] == 3
    assert pokes["times_out"] >= 2
    assert pokes["times_out_soft"] >= 2
    assert pokes["fails_hard"] == pokes["skips"] == pokes["moment_passed"] == 1
    # every wait between two pokes was a workflow timer, not a sleep in an activity
    waits = sum(n - 1 for t, n in pokes.items())
    assert timers >= waits


def test_exponential_backoff_waits_as_base_sensor_operator_does() -> None:
    from airflow.providers.standard.sensors.python import PythonSensor
    from airflow.sdk import DAG

    with DAG("backoff", schedule=None):
        sensor = PythonSensor(
            task_id="s",
            python_callable=bool,
            poke_interval=5,
            timeout=600,
            exponential_backoff=True,
            max_wait=timedelta(seconds=70),
        )
    spec = SensorSpec(poke_interval_s=5, timeout_s=600, exponential_backoff=True, max_wait_s=70.0)
    started = "2026-01-01T00:00:00+00:00"
    for pokes, elapsed in [(1, 0.0), (2, 5.0), (3, 15.0), (5, 80.0), (8, 590.0)]:
        ours = next_poke_s(spec, "backoff", "s", started, elapsed, pokes)
        theirs = sensor._get_next_poke_interval(started, lambda e=elapsed: e, pokes)
        assert ours == theirs, (pokes, ours, theirs)
    assert next_poke_s(SensorSpec(poke_interval_s=7), "d", "t", started, 0.0, 4) == 7
