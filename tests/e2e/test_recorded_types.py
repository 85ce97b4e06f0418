"""A result JSON cannot hold reaches downstream with its types, first run and every later one
(issue 16, item 1b), on the harness's real Airflow (schedulers, api-server, XCom)."""

from __future__ import annotations

import pytest

from tests.harness.airflow_harness import AirflowHarness

DAG_ID = "recorded_types"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_decimal_and_datetime_result_reaches_downstream_on_every_run(
    airflow: AirflowHarness,
) -> None:
    day = airflow.fresh_business_date()
    first = airflow.trigger_dag_run(DAG_ID, {"business_date": day})
    assert airflow.wait_for_run_state(DAG_ID, first)["state"] == "success"
    again = airflow.trigger_dag_run(DAG_ID, {"business_date": day})
    assert airflow.wait_for_run_state(DAG_ID, again)["state"] == "success"
    with airflow.lease_store() as store:
        row = store.get(f"{DAG_ID}/total/{day}")
        acquires = [
            r["outcome"] for r in store.history(f"{DAG_ID}/total/{day}") if r["event"] == "acquire"
        ]
    assert row is not None
    assert row["state"] == "succeeded"
    assert acquires == ["granted", "succeeded"]  # the second run did not run the body
    api = airflow.client()
    for run_id in (first, again):
        value = api.request(
            "GET",
            f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/invoice/xcomEntries/return_value",
        )["value"]
        assert value == f"8201.75 at 2024-02-15T06:07:00+00:00 (token {row['token']})"
