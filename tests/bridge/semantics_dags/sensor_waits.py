"""Sensors as the workflow waits for them: a ``@task.sensor`` that fires on its third poke
(reschedule mode) and hands its ``PokeReturnValue`` on, a PythonSensor returning a
``PokeReturnValue``, one that times out (failed) and one that times out with ``soft_fail``
(skipped), pokes raising ``AirflowFailException`` (failed; skipped under ``soft_fail``) and
``AirflowSkipException`` (skipped), and a deferrable ``DateTimeSensorAsync`` whose moment has
passed (this project's DAG; the corpus comparison runs it in Airflow and through the bridge).
Poke intervals are one second, timeouts two, so the whole DAG waits a few seconds."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pendulum
from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import DAG, PokeReturnValue, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException


def _pokes(run_id: str) -> int:
    """How many times this run's sensor has poked, this one included (a file per run)."""
    name = hashlib.sha1(run_id.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"bridge_sensor_pokes_{name}"
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    return count


def never() -> bool:
    return False


def rows_ready() -> PokeReturnValue:
    return PokeReturnValue(is_done=True, xcom_value={"rows": 3})


with DAG(
    "sensor_waits",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    default_args={"retries": 0},
):

    @task.sensor(poke_interval=1, timeout=60, mode="reschedule")
    def third_poke(run_id: str | None = None) -> PokeReturnValue:
        count = _pokes(str(run_id))
        return PokeReturnValue(is_done=count >= 3, xcom_value=f"fired on poke {count}")

    @task
    def after(value: str) -> str:
        return f"after: {value}"

    @task.sensor(poke_interval=1, timeout=2)
    def fails_hard() -> bool:
        raise AirflowFailException("this poke fails on purpose")

    @task.sensor(poke_interval=1, timeout=2, soft_fail=True)
    def fails_soft() -> bool:
        raise AirflowFailException("this poke fails on purpose, softly")

    @task.sensor(poke_interval=1, timeout=2)
    def skips() -> bool:
        raise AirflowSkipException("this poke skips on purpose")

    after(third_poke())
    fails_hard()
    fails_soft()
    skips()
    PythonSensor(task_id="returns_value", python_callable=rows_ready, poke_interval=1)
    PythonSensor(task_id="times_out", python_callable=never, poke_interval=1, timeout=2)
    PythonSensor(
        task_id="times_out_soft", python_callable=never, poke_interval=1, timeout=2, soft_fail=True
    )
    DateTimeSensorAsync(task_id="moment_passed", target_time="2024-01-01T00:00:00+00:00")
