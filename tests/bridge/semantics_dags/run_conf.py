"""The Airflow run's conf in its tasks (this project's DAG; the corpus comparison triggers it
with a conf of its own, ``test_corpus_truth.CONF``): a template reading ``dag_run.conf``, a
callable reading it from ``dag_run``, and params the conf overrides (Airflow's
``dag_run_conf_overrides_params``), as Airflow gives them and as the handover carries them."""

from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag, task


@dag(
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    params={"greeting": "hello", "count": 1},
)
def run_conf() -> None:
    BashOperator(
        task_id="templated",
        bash_command='echo "$MESSAGE {{ dag_run.conf.get("missing", "none") }}"',
        env={"MESSAGE": '{{ dag_run.conf.get("message") }}'},
    )

    @task
    def from_dag_run(dag_run: object = None) -> dict[str, object]:
        conf = dict(getattr(dag_run, "conf", None) or {})
        return {"message": conf.get("message"), "keys": sorted(conf)}

    @task
    def from_params(params: dict[str, object] | None = None) -> str:
        assert params is not None
        return f"{params['greeting']} x{params['count']}"

    from_dag_run()
    from_params()


run_conf()
