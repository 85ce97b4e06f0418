"""An ETL DAG feeding an ML DAG keeps working when only one of them has moved."""

from __future__ import annotations

import asyncio
from datetime import date, timedelta

import pytest

from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.lease.keys import first_day, lease_key
from bridge.chains import UpstreamNotDone, upstream_gate
from bridge.config import BridgeConfig
from bridge.spec import DagSpec, RetrySpec, TaskSpec
from bridge.temporal.handover import Handover, run_handle
from tests.bridge.conftest import running_worker
from tests.bridge.test_dag_run import new_dag


def test_downstream_dag_gates_on_the_upstream_record_whichever_engine_ran_it(
    config: BridgeConfig, lease_store: LeaseStore, bridge_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRIDGE_LEASE_DSN", bridge_db)
    etl, ml = new_dag(), new_dag()
    in_temporal = (date.today() - timedelta(days=1)).isoformat()
    in_airflow = (date.today() - timedelta(days=2)).isoformat()
    load = TaskSpec(
        "load", callable_ref="builtins:dict", kwargs={"rows": 42}, side_effect_free=True
    )

    def ml_spec(bd: str) -> DagSpec:
        gate = TaskSpec(
            "wait_for_etl",
            callable_ref="bridge.chains:upstream_gate",
            kwargs={"dag_id": etl, "task_id": "load", "business_date": bd},
            side_effect_free=True,
            retry=RetrySpec(maximum_attempts=20, initial_interval_s=0.5, backoff_coefficient=1.0),
        )
        train = TaskSpec("train", upstream=("wait_for_etl",), callable_ref="builtins:len",
                         args=(["model"],), side_effect_free=True)  # fmt: skip
        return DagSpec(ml, (gate, train))

    # nothing ran yet: the gate refuses (and its task retries)
    with pytest.raises(UpstreamNotDone, match="not started"):
        upstream_gate(etl, "load", in_temporal)

    async def scenario() -> tuple[object, object]:
        async with running_worker(config, lease_store) as client:
            handover = Handover(client, config.task_queue("default"))
            # ML (moved) starts first and waits at its gate; ETL runs in Temporal meanwhile
            ml_run = await handover.start_or_attach(ml_spec(in_temporal), in_temporal)
            await asyncio.sleep(1.0)
            etl_run = await handover.start_or_attach(DagSpec(etl, (load,)), in_temporal)
            await run_handle(client, etl_run.workflow_id).result()
            first = await run_handle(client, ml_run.workflow_id).result()
            # ETL still in Airflow for another date (its protected task records the same way)
            holder = Holder.airflow(dag_id=etl, run_id="r", task_id="load", try_number=1)
            key = str(lease_key(etl, "load", in_airflow))
            got = lease_store.acquire(key, holder, business_date=first_day(in_airflow))
            lease_store.complete(got.lease, {"rows": 7})
            later = await handover.start_or_attach(ml_spec(in_airflow), in_airflow)
            return first, await run_handle(client, later.workflow_id).result()

    ran_after_temporal, ran_after_airflow = asyncio.run(scenario())
    assert ran_after_temporal.tasks["wait_for_etl"].result == {"rows": 42}  # type: ignore[attr-defined]
    assert ran_after_airflow.tasks["wait_for_etl"].result == {"rows": 7}  # type: ignore[attr-defined]
    # and an ML DAG still in Airflow calls the same gate in its task
    assert upstream_gate(etl, "load", in_temporal) == {"rows": 42}
