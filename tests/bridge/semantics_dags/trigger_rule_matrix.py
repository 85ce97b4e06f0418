"""Every trigger rule the bridge decides, over each mix of upstream outcomes: a success, a
failure and a skip, two at a time and a skip alone (EmptyOperators, so Airflow's scheduler
decides them without running anything). Run in Airflow and through the bridge by
``tests/bridge/test_corpus_truth.py``, which compares every task's state."""

from __future__ import annotations

import time

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, task
from airflow.sdk.exceptions import AirflowSkipException

from bridge.trigger_rules import RULES

with DAG(
    "trigger_rule_matrix",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    default_args={"retries": 0},
):

    @task
    def fails() -> None:
        raise RuntimeError("this upstream fails on purpose")

    @task
    def skips() -> None:
        # after ``fails`` has failed: Airflow decides all_success as soon as one upstream
        # skipped (skipped), the workflow once all are done (a failure first: upstream_failed)
        time.sleep(5)
        raise AirflowSkipException("this upstream skips on purpose")

    ups = {"ok": EmptyOperator(task_id="ok"), "bad": fails(), "skip": skips()}
    mixes = {"ok_bad": ("ok", "bad"), "ok_skip": ("ok", "skip"), "bad_skip": ("bad", "skip")}
    mixes["skip"] = ("skip",)
    for rule in sorted(RULES):
        for mix, names in mixes.items():
            decided = EmptyOperator(task_id=f"{rule}__{mix}", trigger_rule=rule)
            for name in names:
                ups[name] >> decided
