"""@task.bash: the function's returned command runs with bash (its output is the XCom), the
function takes the context and an upstream task's result, and a non-zero exit fails the task
(this project's DAG; the corpus comparison runs it in Airflow and through the bridge)."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False)
def bash_decorator() -> None:
    @task
    def word() -> str:
        return "tide"

    @task.bash
    def echo(value: str, ds: str | None = None) -> str:
        return f'echo "{value} $((6 * 7)) {ds}"'

    @task.bash
    def fails() -> str:
        return "exit 3"

    @task.bash
    def skips() -> str:
        return "exit 99"

    echo(word())
    fails()
    skips()


bash_decorator()
