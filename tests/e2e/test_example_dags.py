"""The example DAGs: the DagBag loads each without import errors, and each runs once for real
on the harness's Airflow, with its effect checked in the database it writes to."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness.airflow_harness import DAG_FOLDERS, AirflowHarness, wait_for

EXAMPLES = {
    "billing_nightly",
    "hourly_rollup",
    "soc2_nightly_backup",
    "etl_daily",
    "ml_training",
    "model_deploy",
    "tenant_webhooks",
}


def test_dagbag_loads_every_example_without_import_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    for folder in DAG_FOLDERS.values():
        monkeypatch.syspath_prepend(str(folder))
    bag = DagBag(str(DAG_FOLDERS["examples"]))
    assert bag.import_errors == {}
    assert set(bag.dags) == EXAMPLES
    scenarios = DagBag(str(DAG_FOLDERS["scenarios"]))
    assert scenarios.import_errors == {}
    for name in ("billing_charges", "warehouse"):
        sys.modules.pop(name, None)


def test_runs_that_start_together_create_the_example_tables_once(
    monkeypatch: pytest.MonkeyPatch, empty_db: str
) -> None:
    # billing's prepare and the warehouse examples' (webhooks, rollup) ran at once on a new
    # database, and CREATE ... IF NOT EXISTS raced in the catalog: a duplicate-key error
    monkeypatch.syspath_prepend(str(DAG_FOLDERS["examples"]))
    import billing_charges
    import warehouse

    steps = [billing_charges.prepare_sink, warehouse.prepare] * 4
    with ThreadPoolExecutor(len(steps)) as pool:
        for done in [pool.submit(step, empty_db) for step in steps]:
            done.result()  # raises what the step raised
    tables = _rows(
        empty_db,
        "SELECT count(*) FROM pg_tables WHERE schemaname IN "
        "('billing', 'analytics', 'ml', 'webhooks')",
    )[0][0]
    assert tables >= 4
    for name in ("billing_charges", "warehouse"):
        sys.modules.pop(name, None)


def _rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def _xcom(
    airflow: AirflowHarness, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> Any:
    value = airflow.client().request(
        "GET",
        f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value",
        params={"map_index": map_index},
    )["value"]
    return json.loads(value) if isinstance(value, str) and value[:1] in "[{" else value


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_each_example_dag_runs_once(airflow: AirflowHarness, tmp_path: Path) -> None:
    api = airflow.client()
    day = airflow.fresh_business_date()
    hour = f"{day}T02"
    billing = airflow.trigger_dag_run(
        "billing_nightly", {"business_date": day, "charge_delay": 0, "customers": 340}
    )
    backup_dir = tmp_path / "backups"
    backup_dir.mkdir(mode=0o777)
    backup = airflow.trigger_dag_run(
        "soc2_nightly_backup", {"business_date": day, "backup_dir": str(backup_dir)}
    )
    hooks = airflow.trigger_dag_run(
        "tenant_webhooks", {"business_date": hour, "tenants": ["acme", "globex", "initech"]}
    )
    assert airflow.wait_for_run_state("billing_nightly", billing)["state"] == "success"
    assert len(airflow.charges(day)) == 340

    # the rollup of the hour the charges were made in, and the ETL -> ML -> deploy chain
    charged_hour = _rows(
        airflow.sink_dsn,
        "SELECT to_char(min(charged_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24') "
        "FROM billing.charges WHERE business_date = %s",
        day,
    )[0][0]
    rollup = airflow.trigger_dag_run("hourly_rollup", {"business_date": charged_hour})
    for dag_id in ("ml_training", "model_deploy"):
        airflow.wait_for_dag(dag_id)
        api.set_paused(dag_id, False)
    etl = airflow.trigger_dag_run("etl_daily", {"business_date": day})

    for dag_id, run_id in (
        ("soc2_nightly_backup", backup),
        ("tenant_webhooks", hooks),
        ("hourly_rollup", rollup),
        ("etl_daily", etl),
    ):
        assert airflow.wait_for_run_state(dag_id, run_id)["state"] == "success", dag_id

    dump = _xcom(airflow, "soc2_nightly_backup", backup, "backup")
    assert Path(dump["path"]).stat().st_size == dump["bytes"] > 0
    assert dump["objects"] > 0, "pg_restore --list found nothing in the dump"

    rolled = _rows(
        airflow.sink_dsn,
        "SELECT charges FROM analytics.hourly_charges WHERE hour = %s",
        charged_hour,
    )
    assert rolled
    assert rolled[0][0] >= 1

    outbox = _rows(
        airflow.sink_dsn,
        "SELECT tenant, headers->>'X-Lease-Key' FROM webhooks.outbox WHERE business_date = %s",
        hour,
    )
    assert sorted(outbox) == [
        (t, f"tenant_webhooks/send/{hour}/{t}") for t in ("acme", "globex", "initech")
    ]
    rendered = {
        ti["rendered_map_index"]
        for ti in api.task_instances("tenant_webhooks", hooks)
        if ti["task_id"] == "send"
    }
    assert rendered == {"acme", "globex", "initech"}

    # a tenant added at the front shifts every map index, not the keys: only it is queued
    again = airflow.trigger_dag_run(
        "tenant_webhooks",
        {"business_date": hour, "tenants": ["aardvark", "acme", "globex", "initech"]},
    )
    assert airflow.wait_for_run_state("tenant_webhooks", again)["state"] == "success"
    outbox = _rows(
        airflow.sink_dsn, "SELECT tenant FROM webhooks.outbox WHERE business_date = %s", hour
    )
    assert sorted(t for (t,) in outbox) == ["aardvark", "acme", "globex", "initech"]

    # the asset chain: training and deploy ran because the ETL updated the features asset
    def deployed() -> list[tuple[Any, ...]]:
        return _rows(
            airflow.sink_dsn,
            "SELECT d.model_id, m.business_date FROM ml.deployments d "
            "JOIN ml.models m ON m.id = d.model_id",
        )

    wait_for(deployed, timeout=180, what="model_deploy to deploy the model ml_training trained")
    for dag_id in ("ml_training", "model_deploy"):
        runs = api.request("GET", f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]
        # (unpausing etl_daily also made its scheduled run, so there can be two events)
        assert runs
        assert {r["run_type"] for r in runs} == {"asset_triggered"}, runs
        for run in runs:
            assert airflow.wait_for_run_state(dag_id, run["dag_run_id"])["state"] == "success"
