"""LatestOnlyOperator and the trigger rules after it (this project's DAG; the corpus comparison
runs it in Airflow and through the bridge): a manual run and the latest scheduled run let its
downstream tasks run; a backfilled run of an old interval is not the latest, so its direct
downstream tasks are skipped and the rules after them decide the rest
(``test_corpus_truth.test_latest_only_decides_as_airflow_for_scheduled_and_backfilled_runs``).
"""

from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.latest_only import LatestOnlyOperator
from airflow.sdk import dag, task


@dag(schedule="@daily", start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False)
def latest_only_cases() -> None:
    latest = LatestOnlyOperator(task_id="latest")
    gated = EmptyOperator(task_id="gated")

    @task
    def report(dag_run: object = None) -> str:
        return f"ran for a {getattr(dag_run, 'run_type', None)} run"

    @task
    def side() -> int:
        return 1

    reported = report()
    other = side()
    latest >> [gated, reported]

    @task
    def after_report(value: str) -> str:
        return value.upper()

    after_report(reported)
    for rule in (
        "all_success",
        "all_done",
        "none_failed",
        "one_success",
        "all_skipped",
        "none_failed_min_one_success",
        "none_skipped",
    ):
        [gated, other] >> EmptyOperator(task_id=f"join_{rule}", trigger_rule=rule)

    @task(trigger_rule="all_skipped")
    def only_when_not_latest() -> str:
        return "skipped downstream"

    [gated, reported] >> only_when_not_latest()


latest_only_cases()
