"""The billing deployment of the incident: its databases and its Airflow stack.

Three databases on one Postgres server (Airflow's metadata, the lease store, the billing sink),
the Airflow Connections that point the DAGs at them, and an ``AirflowStack`` over the given DAG
folders. The demo builds one on an embedded Postgres; the end-to-end harness builds one on the
test server.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_plugins.demo.celery_workers import CeleryConfig
from airflow_plugins.demo.processor import ProcessorProcess
from airflow_plugins.demo.stack import AirflowStack
from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, migrate

LEASE_CONN_ID = "exactly_once_leases"
BILLING_CONN_ID = "billing_db"
WAREHOUSE_CONN_ID = "warehouse_db"
PROCESSOR_CONN_ID = "payment_processor"
REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"

# the billing database's schema is the example DAGs' own (one source of truth)
BILLING_SCHEMA = REPO_DAGS / "sql" / "billing_schema.sql"

# Lease timing for replays and tests: a dead holder blocks its key for 10 s, not a minute.
FAST_LEASES = {
    "AIRFLOW__EXACTLY_ONCE__TTL": "10",
    "AIRFLOW__EXACTLY_ONCE__HEARTBEAT": "2",
    "AIRFLOW__EXACTLY_ONCE__WAIT_POLL_INTERVAL": "1",
}


def with_dbname(dsn: str, dbname: str) -> str:
    """``dsn`` pointed at another database of the same server."""
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


def airflow_uri(dsn: str) -> str:
    """An Airflow Connection URI (type postgres) for a libpq DSN."""
    p = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = str(p.get("user", "postgres"))
    if p.get("password"):
        auth += f":{p['password']}"
    return f"postgres://{auth}@{p.get('host', '127.0.0.1')}:{p.get('port', 5432)}/{p['dbname']}"


def create_database(admin_dsn: str, prefix: str) -> str:
    """Creates a new empty database on the server of ``admin_dsn``; returns its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_dbname(admin_dsn, name)


# A scheduler killed alone (SIGKILL, the OOM killer) leaves its LocalExecutor workers alive, and
# they hold a copy of its metadata-database socket (inherited when they were forked): a
# transaction it had open stays open, with its row locks, until they exit, and the other
# scheduler skips the locked DAG runs meanwhile (seen: 7 minutes, until the workers were
# killed). The server ends such a session after this long idle in its transaction: shorter
# than the stacks' scheduler_health_check_threshold (15 s), so the locks are gone before the
# standby resets the dead scheduler's tasks, as when its connection closes at once.
METADATA_IDLE_IN_TRANSACTION = "10s"


def guard_metadata_database(
    admin_dsn: str, dsn: str, timeout: str = METADATA_IDLE_IN_TRANSACTION
) -> None:
    """Makes the server end a metadata-database session left idle in a transaction for
    ``timeout`` (sessions started from now on)."""
    name = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = {}").format(
                sql.Identifier(name), sql.Literal(timeout)
            )
        )


def drop_database(admin_dsn: str, dsn: str) -> None:
    """Drops a database made by ``create_database`` (ending its sessions)."""
    name = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


class BillingDeployment:
    """Databases + Airflow stack of the billing incident.

    Args:
        admin_dsn: a superuser DSN of the Postgres server to create the databases on.
        dag_folders: bundle name -> folder (default: the repository's ``dags/``).
        enabled: the plugin's ``[exactly_once] enabled`` switch for the whole stack.
        extra_env: more Airflow settings.
        celery: run the stack on CeleryExecutor with these workers (default: LocalExecutor).
    """

    def __init__(
        self,
        admin_dsn: str,
        *,
        dag_folders: Mapping[str, Path] | None = None,
        enabled: bool = True,
        extra_env: Mapping[str, str] | None = None,
        celery: CeleryConfig | None = None,
    ) -> None:
        self.celery = celery
        self.admin_dsn = admin_dsn
        self.dag_folders = dict(dag_folders or {"examples": REPO_DAGS})
        self.enabled = enabled
        self.extra_env = dict(extra_env or {})
        self.metadata_dsn = ""
        self.lease_dsn = ""
        self.sink_dsn = ""
        self.stack: AirflowStack | None = None
        self.processor: ProcessorProcess | None = None

    def create(self) -> AirflowStack:
        """Creates and prepares the three databases; returns the (not yet started) stack."""
        self.metadata_dsn = create_database(self.admin_dsn, "eo_airflow")
        guard_metadata_database(self.admin_dsn, self.metadata_dsn)
        self.lease_dsn = create_database(self.admin_dsn, "eo_leases")
        self.sink_dsn = create_database(self.admin_dsn, "eo_billing")
        migrate(self.lease_dsn, LEASE_STORE)
        migrate(self.sink_dsn, SINK_FENCE)
        with psycopg.connect(self.sink_dsn, autocommit=True) as conn:
            conn.execute(BILLING_SCHEMA.read_text())
        # the payment processor the billing DAG charges through (its own process, 127.0.0.1)
        log = Path(tempfile.mkdtemp(prefix="eo-processor-")) / "processor.log"
        self.processor = ProcessorProcess(log)
        processor_url = self.processor.start()
        env = {**FAST_LEASES, "AIRFLOW__EXACTLY_ONCE__ENABLED": str(self.enabled)}
        env.update(self.extra_env)
        self.stack = AirflowStack(
            self.metadata_dsn,
            dag_folders=self.dag_folders,
            connections={
                LEASE_CONN_ID: airflow_uri(self.lease_dsn),
                BILLING_CONN_ID: airflow_uri(self.sink_dsn),
                # the analytics/ML/webhook examples' warehouse: the same database here
                WAREHOUSE_CONN_ID: airflow_uri(self.sink_dsn),
                PROCESSOR_CONN_ID: processor_url,
            },
            extra_env=env,
            celery=self.celery,
        )
        return self.stack

    def charges(self, business_date: str) -> list[dict[str, Any]]:
        """Every charge row of ``business_date`` in the billing database."""
        with psycopg.connect(self.sink_dsn, autocommit=True) as conn:
            cur = conn.execute(
                "SELECT customer, token, writer, charged_at FROM billing.charges "
                "WHERE business_date = %s ORDER BY id",
                (business_date,),
            )
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def processor_charges(self, business_date: str) -> list[dict[str, Any]]:
        """Every charge the payment processor made for ``business_date`` (its own record)."""
        if self.processor is None:
            return []
        return [
            c
            for c in self.processor.charges()
            if c["metadata"].get("business_date") == business_date
        ]

    def destroy(self) -> None:
        """Stops the stack and the processor, and drops the three databases."""
        if self.stack is not None:
            self.stack.stop()
        if self.processor is not None:
            self.processor.stop()
        for dsn in (self.metadata_dsn, self.lease_dsn, self.sink_dsn):
            if dsn:
                drop_database(self.admin_dsn, dsn)
