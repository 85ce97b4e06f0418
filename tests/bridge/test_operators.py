"""Operators other than Python callables run unchanged in a worker, on the real Temporal server.

The worker rebuilds a BashOperator from its DAG folder, renders ``{{ ds }}``, params and
``ti.xcom_pull`` with the task SDK's renderer, runs ``execute`` and returns its output as the
task's result; a downstream operator reads it through XCom (a template and an XComArg).
Sensors without a poke of their own, deferrable operators and operators reaching Airflow's
metadata DB stay reported.
"""

from __future__ import annotations

import asyncio
import signal
import textwrap
import uuid
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pendulum
import psycopg
import pytest
from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.sensors.time_delta import TimeDeltaSensor, WaitSensor
from airflow.sdk import DAG, BaseOperator
from temporalio.client import WorkflowFailureError

from airflow_plugins.lease import InvalidLeaseInput, LeaseStore
from bridge.config import BridgeConfig
from bridge.graph import shadow_refusals
from bridge.in_airflow.router import single_task_spec
from bridge.in_airflow.translate import UntranslatableDag, translate
from bridge.spec import TaskKind
from bridge.temporal.client import connect
from bridge.temporal.handover import Handover, run_handle
from bridge.worker.catalog import TaskCatalog
from bridge.worker.execution import business_run
from tests.bridge.conftest import kill_process, running_worker, start_worker_process

BD = (date.today() - timedelta(days=2)).isoformat()

DAG_FILE = """
import pendulum
import psycopg
import pytest
from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, task

OUT = {out!r}

with DAG({dag_id!r}, schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1),
         params={{"customer": "acme"}}, tags=["side-effect-free"]):

    @task
    def extract() -> dict:
        return {{"n": 3}}

    stamp = BashOperator(
        task_id="stamp",
        bash_command=(
            "echo '{{{{ ds }}}} {{{{ params.customer }}}} try={{{{ ti.try_number }}}} "
            "run={{{{ run_id }}}} n={{{{ ti.xcom_pull(task_ids='extract')['n'] }}}}' >> " + OUT
            + "; echo {{{{ ds_nodash }}}}"
        ),
    )
    use = BashOperator(
        task_id="use",
        bash_command="echo \\"got=$FROM_UP pulled={{{{ ti.xcom_pull(task_ids='stamp') }}}}\\" >> "
        + OUT + "; echo used",
        env={{"FROM_UP": stamp.output}},
    )
    record = SQLExecuteQueryOperator(
        task_id="record",
        conn_id="billing_db",
        sql="INSERT INTO charges (run_key, customer, writer) "
        "VALUES (%(key)s, %(customer)s, %(writer)s)",
        parameters={{"key": "{{{{ ds }}}}", "customer": "{{{{ params.customer }}}}",
                    "writer": "{{{{ ti.xcom_pull(task_ids='stamp') }}}}"}},
    )
    extract() >> stamp >> use >> record
"""


class _Deferring(BaseOperator):
    """Waits on a trigger without saying so in a ``deferrable`` flag."""

    def execute(self, context: Any) -> None:
        self.defer(trigger=None, method_name="done")  # type: ignore[arg-type]


class _MaybeDeferring(BaseOperator):
    """Defers only when built with ``deferrable=True`` (the providers' convention)."""

    def __init__(self, *, deferrable: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable

    def execute(self, context: Any) -> str:
        if self.deferrable:
            self.defer(trigger=None, method_name="done")  # type: ignore[arg-type]
        return "sync"


class _ReadsMetadata(BaseOperator):
    """Reads Airflow's metadata DB directly."""

    def execute(self, context: Any) -> Any:
        from airflow.utils.session import create_session

        with create_session() as session:
            return session.is_active


def test_operators_translate_and_sensors_deferrables_and_orm_users_are_reported() -> None:
    with DAG("ops", schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1)) as dag:
        load = BashOperator(task_id="load", bash_command="echo {{ ds }}")
        sql = SQLExecuteQueryOperator(task_id="sql", conn_id="billing_db", sql="SELECT 1")
        # a sensor with no poke of its own: it waits in its execute (sensors with one translate)
        wait = WaitSensor(task_id="wait_for_file", time_to_wait=timedelta(minutes=1))
        later = _Deferring(task_id="later")
        asked = _MaybeDeferring(task_id="asked", deferrable=True)
        meta = _ReadsMetadata(task_id="meta")
        load >> sql >> [wait, later, meta, asked]

    translation = translate(dag)
    reasons = {u.task_id: u.reason for u in translation.untranslatable}
    assert set(reasons) == {"wait_for_file", "later", "meta", "asked"}
    assert "sensor" in reasons["wait_for_file"]
    assert "deferrable" in reasons["later"]
    assert "deferrable" in reasons["asked"]
    assert "_Deferring calls defer()" in reasons["later"]
    assert "metadata DB" in reasons["meta"]
    assert "create_session" in reasons["meta"]
    report = str(UntranslatableDag(translation))
    assert "later (_Deferring)" in report
    assert "meta (_ReadsMetadata)" in report

    with DAG("ops_ok", schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1)) as ok:
        load = BashOperator(task_id="load", bash_command="echo {{ ds }}")
        sql = SQLExecuteQueryOperator(task_id="sql", conn_id="billing_db", sql="SELECT 1")
        check = BashOperator(task_id="check", bash_command="echo {{ ti.xcom_pull('load') }}")
        sync = _MaybeDeferring(task_id="sync")  # its deferrable flag is off: runs in a worker
        wait = TimeDeltaSensor(task_id="wait", delta=timedelta(minutes=1), poke_interval=5)
        load >> sql >> check >> sync >> wait
    spec = translate(ok).spec
    assert spec is not None
    assert {t.task_id: t.kind for t in spec.tasks} == {
        "load": TaskKind.EXECUTE,
        "sql": TaskKind.EXECUTE,
        "check": TaskKind.EXECUTE,
        "sync": TaskKind.EXECUTE,
        "wait": TaskKind.EXECUTE,
    }
    # a sensor with a poke of its own is poked by the workflow, between durable timers
    wait_spec = spec.task("wait").sensor
    assert wait_spec is not None
    assert (wait_spec.poke_interval_s, wait_spec.deferrable) == (5.0, False)
    assert spec.task("load").sensor is None
    assert spec.task("sql").upstream == ("load",)
    # an operator may pull any earlier task's XCom: every ancestor's result is passed to it
    assert spec.task("check").upstream == ("load", "sql")
    # writes outside a fence and not declared side-effect-free: refused for shadow, by name
    refused = [r.split(":")[0] for r in shadow_refusals(spec)]
    assert refused == ["load", "sql", "check", "sync", "wait"]


def test_operators_run_once_with_rendered_templates_and_upstream_xcom(
    config: BridgeConfig,
    lease_store: LeaseStore,
    sink: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the SQL operator's hook finds its connection as Airflow's environment convention says
    part = psycopg.conninfo.conninfo_to_dict(sink)
    uri = f"postgresql://{part['user']}@{part['host']}:{part['port']}/{part['dbname']}"
    monkeypatch.setenv("AIRFLOW_CONN_BILLING_DB", uri)
    dag_id = f"bash_{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out.txt"
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / f"{dag_id}.py").write_text(
        textwrap.dedent(DAG_FILE.format(out=str(out), dag_id=dag_id))
    )
    catalog = TaskCatalog(str(folder))
    catalog.load()  # on the main thread: Airflow's parser uses SIGALRM
    dag = catalog.dag(dag_id)
    translation = translate(dag)
    spec = translation.spec
    assert spec is not None, translation.report()

    async def scenario() -> tuple[Any, Any, str]:
        async with running_worker(config, lease_store, catalog) as client:
            handover = Handover(client, config.task_queue("default"), store=lease_store)
            got = await handover.start_or_attach(spec, BD)
            assert got.started
            result = await run_handle(client, got.workflow_id).result()
            again = await handover.start_or_attach(spec, BD)
            return result, again, got.workflow_id

    result, again, wid = asyncio.run(scenario())
    assert result.status == "success"
    nodash = BD.replace("-", "")
    assert result.tasks["stamp"].result == nodash
    assert result.tasks["use"].result == "used"
    assert out.read_text().splitlines() == [
        f"{BD} acme try=1 run={wid} n=3",
        f"got={nodash} pulled={nodash}",
    ]
    with psycopg.connect(sink) as conn:
        rows = conn.execute("SELECT run_key, customer, writer FROM charges").fetchall()
    assert rows == [(BD, "acme", nodash)]  # the SQL operator's templated parameters
    assert not again.started  # a second handover runs nothing: the file is unchanged
    assert len(out.read_text().splitlines()) == 2
    with psycopg.connect(sink) as conn:
        assert conn.execute("SELECT count(*) FROM charges").fetchone() == (1,)


FAILING_DAG = """
from datetime import timedelta

import pendulum
import psycopg
import pytest
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

with DAG({dag_id!r}, schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1)):
    BashOperator(
        task_id="flaky",
        bash_command="echo 'try={{{{ ti.try_number }}}}' >> {out}; exit 3",
        retries=1,
        retry_delay=timedelta(seconds=0.2),
    )
"""


def test_failing_operator_in_the_worker_command_is_retried_by_its_policy_then_fails(
    config: BridgeConfig, lease_store: LeaseStore, tmp_path: Path
) -> None:
    """The real worker command (``python -m bridge.worker``) rebuilds the operator from its
    ``BRIDGE_DAGS_FOLDER``; the task's ``retries`` give two attempts, then the run fails."""
    dag_id = f"flaky_{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out.txt"
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / f"{dag_id}.py").write_text(FAILING_DAG.format(out=str(out), dag_id=dag_id))
    catalog = TaskCatalog(str(folder))
    catalog.load()
    spec = translate(catalog.dag(dag_id)).spec
    assert spec is not None
    worker = start_worker_process(
        config,
        tmp_path / "worker.log",
        BRIDGE_DAGS_FOLDER=str(folder),
        AIRFLOW_HOME=str(tmp_path / "airflow"),
    )

    async def scenario() -> None:
        client = await connect(config)
        got = await Handover(client, config.task_queue("default")).start_or_attach(spec, BD)
        await asyncio.wait_for(run_handle(client, got.workflow_id).result(), 120)

    try:
        with pytest.raises(WorkflowFailureError) as failure:
            asyncio.run(scenario())
    finally:
        kill_process(worker, signal.SIGTERM)
    assert "flaky" in str(failure.value.cause)
    assert "non-zero exit code 3" in str(failure.value.cause)
    assert out.read_text().splitlines() == ["try=1", "try=2"]  # retries=1: two attempts


def test_business_run_dates_follow_the_period_in_the_dag_timezone() -> None:
    run, ds = business_run("d", "r", "2024-02", period="month", timezone="Europe/Berlin")
    assert ds == "2024-02-01"
    assert run.logical_date.isoformat() == "2024-01-31T23:00:00+00:00"
    assert run.data_interval_end.isoformat() == "2024-02-29T23:00:00+00:00"
    hourly, ds = business_run("d", "r", "2024-02-15T07", period="hour", timezone="UTC")
    assert ds == "2024-02-15"
    assert hourly.data_interval_start.isoformat() == "2024-02-15T07:00:00+00:00"
    assert hourly.data_interval_end.isoformat() == "2024-02-15T08:00:00+00:00"
    assert hourly.conf == {"business_date": "2024-02-15T07"}


def test_an_operator_with_upstream_tasks_is_not_handed_over_alone() -> None:
    with DAG("alone", schedule="0 2 * * *", start_date=pendulum.datetime(2024, 1, 1)) as dag:
        first = BashOperator(task_id="first", bash_command="echo 1")
        second = BashOperator(task_id="second", bash_command="echo {{ ti.xcom_pull('first') }}")
        first >> second
    assert single_task_spec(first, {"dag": dag}).tasks[0].kind is TaskKind.EXECUTE
    with pytest.raises(InvalidLeaseInput, match="only a whole-DAG handover"):
        single_task_spec(second, {"dag": dag})
