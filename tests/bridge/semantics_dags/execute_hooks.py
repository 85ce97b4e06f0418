"""Pre/post-execute hooks around a task (this project's DAG; the corpus comparison runs it in
Airflow and through the bridge): ``@task.run_if`` and ``@task.skip_if`` that run or skip their
task (and the rules after a skip), ``pre_execute=`` / ``post_execute=`` on an operator (the
post hook sees the result; one that raises fails the task), run around ``execute`` as the
task runner runs them."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowSkipException


def _skip(context: Any) -> None:
    raise AirflowSkipException("the pre-execute hook skips it")


def _check_result(context: Any, result: Any) -> None:
    if result != "checked":
        raise ValueError(f"the post-execute hook rejects {result!r}")


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False)
def execute_hooks() -> None:
    @task.run_if(lambda context: context["params"].get("go", True))
    @task
    def runs() -> str:
        return "ran"

    @task.run_if(lambda context: context["ti"].task_id == "nobody")
    @task
    def not_run() -> str:
        return "never"

    @task.skip_if(lambda context: True)
    @task
    def skipped() -> str:
        return "never"

    @task
    def after_skip(value: str) -> str:
        return value

    @task(trigger_rule="none_failed")
    def after_skip_none_failed() -> str:
        return "none failed"

    runs()
    not_run()
    skipped_value = skipped()
    after_skip(skipped_value)
    skipped_value >> after_skip_none_failed()
    BashOperator(task_id="pre_skips", bash_command="echo never", pre_execute=_skip)
    BashOperator(task_id="post_passes", bash_command="echo checked", post_execute=_check_result)
    BashOperator(task_id="post_fails", bash_command="echo other", post_execute=_check_result)


execute_hooks()
