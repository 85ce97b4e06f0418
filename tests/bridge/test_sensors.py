"""Sensors in the DAG-run workflow on the real Temporal dev server: pokes are activities, the
waits between them durable timers, outcomes Airflow's (``semantics_dags/sensor_waits.py``; the
corpus truth check compares the same DAG with Airflow's run of it)."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
import uuid
import warnings
from datetime import date, timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.worker import Replayer

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig
from bridge.in_airflow.translate import translate
from bridge.sensor_wait import next_poke_s
from bridge.spec import DagRunInput, SensorSpec
from bridge.worker.catalog import TaskCatalog
from bridge.worker.lanes import WORKFLOWS
from bridge.worker.workflows import DagRunWorkflow
from tests.bridge.conftest import running_worker
from tests.bridge.test_corpus_truth import _result_of

with warnings.catch_warnings():  # the provider's PythonSensor imports a name Airflow deprecates
    warnings.simplefilter("ignore")  # (an error under this project's pytest settings)
    from airflow.providers.standard.sensors.python import PythonSensor

SEMANTICS = Path(__file__).parent / "semantics_dags"


Outcomes = dict[str, tuple[str, object]]


def run_sensors(
    config: BridgeConfig, store: LeaseStore, folder: Path, dag_id: str
) -> tuple[Outcomes, dict[str, int], int]:
    """Runs a DAG of ``folder`` through the workflow; returns each task's (status, result), how
    many times each sensor was poked, and how many timers the workflow started."""
    catalog = TaskCatalog(str(folder))
    catalog.load()  # on the main thread: Airflow's parser uses SIGALRM
    translation = translate(catalog.dag(dag_id))
    spec = translation.spec
    assert spec is not None, translation.report()
    day = (date.today() - timedelta(days=1 + uuid.uuid4().int % 300)).isoformat()
    wid = f"{dag_id}/{day}/{uuid.uuid4().hex[:6]}"

    async def scenario() -> tuple[Outcomes, dict[str, int], int]:
        async with running_worker(config, store, catalog) as client:
            handle = await client.start_workflow(
                DagRunWorkflow.run,
                DagRunInput(spec, day, source="test"),
                id=wid,
                task_queue=config.task_queue(spec.lane),
            )
            result = await _result_of(client, wid)
            with contextlib.suppress(WorkflowFailureError):
                await handle.result()
            history = await handle.fetch_history()
            # the waits replay: the sensor loop is deterministic workflow code
            replayed = await Replayer(workflows=WORKFLOWS).replay_workflow(history)
            assert replayed.replay_failure is None, replayed.replay_failure
            events = history.events
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

    return asyncio.run(scenario())


def test_sensors_poke_on_durable_timers_and_end_as_in_airflow(
    config: BridgeConfig, lease_store: LeaseStore
) -> None:
    outcomes, pokes, timers = run_sensors(config, lease_store, SEMANTICS, "sensor_waits")
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


DEFERRING_DAG = '''
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.providers.standard.sensors.time_delta import TimeDeltaSensor
from airflow.providers.standard.triggers.file import FileTrigger
from airflow.sdk import DAG
from airflow.sdk.bases.sensor import BaseSensorOperator


class CountingSensor(BaseSensorOperator):
    """Deferrable on a trigger that is not a moment: the workflow polls its poke."""

    def __init__(self, *, fire_on, deferrable=True, **kwargs):
        super().__init__(**kwargs)
        self.fire_on = fire_on
        self.deferrable = deferrable

    def poke(self, context):
        path = Path({folder!r}) / (self.task_id + ".pokes")
        count = int(path.read_text()) + 1 if path.exists() else 1
        path.write_text(str(count))
        return count >= self.fire_on

    def execute(self, context):
        if self.poke(context):
            return "at once"
        self.defer(
            trigger=FileTrigger(filepath="/nonexistent", poke_interval=self.poke_interval),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context, event=None):
        return None


with DAG("deferring", schedule=None, start_date=pendulum.datetime(2024, 1, 1)):
    CountingSensor(task_id="first_poke", fire_on=1)
    CountingSensor(task_id="polled", fire_on=3, poke_interval=1, timeout=30)
    CountingSensor(task_id="deferral_times_out", fire_on=99, poke_interval=1, timeout=2)
    TimeDeltaSensor(
        task_id="moment_after_timeout",
        delta=timedelta(days=1000),
        deferrable=True,
        timeout=2,
        soft_fail=True,
    )
'''


def test_deferrable_sensors_wait_on_their_moment_or_poll_their_condition(
    config: BridgeConfig, lease_store: LeaseStore, tmp_path: Path
) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    dag_file = DEFERRING_DAG.format(folder=str(tmp_path))
    (folder / "deferring.py").write_text(textwrap.dedent(dag_file))
    outcomes, pokes, timers = run_sensors(config, lease_store, folder, "deferring")
    assert outcomes == {
        "first_poke": ("succeeded", "at once"),  # execute returned before deferring
        "polled": ("succeeded", None),  # deferred, then its poke fired on the third call
        "deferral_times_out": ("failed", None),  # the deferral's timeout, in workflow time
        "moment_after_timeout": ("skipped", None),  # its moment is after its timeout: soft_fail
    }
    assert pokes["first_poke"] == 1
    assert pokes["polled"] == 3  # execute (which poked once and deferred), then two pokes
    assert (tmp_path / "polled.pokes").read_text() == "3"
    assert pokes["moment_after_timeout"] == 1  # one execute, then one timer to the timeout
    assert timers >= 1 + 1
