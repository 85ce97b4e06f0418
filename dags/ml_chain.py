"""ETL -> ML training -> deploy, across three DAGs chained by assets.

``etl_daily`` loads the day's features and updates the asset ``warehouse://ml/features``;
``ml_training`` is scheduled on that asset and updates ``warehouse://ml/model``;
``model_deploy`` is scheduled on the model asset. Assets, not ``ExternalTaskSensor``: the chain
is a dependency on data, not on aligned schedules. A sensor needs the three DAGs' logical dates
to line up and holds a worker slot (or reschedules) while it polls; an asset event starts the
next DAG as soon as the upstream task succeeded, carries which run produced the data, and still
works when a team changes its DAG's schedule or moves it to Temporal (the bridge can emit the
same asset event).
"""

from __future__ import annotations

from typing import Any

import pendulum
import psycopg
from airflow.sdk import DAG, Asset, get_current_context, task
from warehouse import dsn, prepare, sql

FEATURES = Asset("warehouse://ml/features")
MODEL = Asset("warehouse://ml/model")
START = pendulum.datetime(2024, 1, 1, tz="UTC")


def _business_date() -> str:
    context = get_current_context()
    conf = context["dag_run"].conf or {}
    return str(conf.get("business_date") or context.get("ds") or pendulum.now("UTC").date())


with DAG(
    dag_id="etl_daily",
    schedule="0 3 * * *",
    start_date=START,
    catchup=False,
    tags=["ml-chain", "example"],
):

    @task(outlets=[FEATURES])
    def extract_features() -> dict[str, Any]:
        """Loads the day's per-customer totals into ``ml.features`` (idempotent upsert)."""
        target = dsn()
        prepare(target)
        day = _business_date()
        with psycopg.connect(target, autocommit=True) as conn:
            rows = conn.execute(sql("etl_features"), {"business_date": day}).rowcount
        return {"business_date": day, "rows": rows}

    extract_features()


with DAG(
    dag_id="ml_training",
    schedule=[FEATURES],
    start_date=START,
    catchup=False,
    tags=["ml-chain", "example"],
):

    @task(outlets=[MODEL])
    def train() -> dict[str, Any]:
        """Fits the (deliberately tiny) model: the mean amount over all features."""
        with psycopg.connect(dsn(), autocommit=True) as conn:
            row = conn.execute(sql("train_model"), {"business_date": _business_date()}).fetchone()
        assert row is not None
        return {"model_id": int(row[0]), "mean_cents": float(row[1]), "rows": int(row[2])}

    train()


with DAG(
    dag_id="model_deploy",
    schedule=[MODEL],
    start_date=START,
    catchup=False,
    tags=["ml-chain", "example"],
):

    @task
    def deploy() -> dict[str, Any]:
        """Marks the newest model deployed (once per model)."""
        with psycopg.connect(dsn(), autocommit=True) as conn:
            row = conn.execute(sql("deploy_model")).fetchone()
        return {"deployed_model_id": int(row[0]) if row else None}

    deploy()
