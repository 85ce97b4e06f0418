"""The warehouse database of the analytics, ML and webhook examples (not a DAG file).

Its tables are in ``sql/warehouse_schema.sql``; ``prepare`` creates them if missing. In the
examples the warehouse is the billing database's server (Connection ``warehouse_db``).
"""

from __future__ import annotations

from pathlib import Path

import psycopg

WAREHOUSE_CONN_ID = "warehouse_db"
SQL = Path(__file__).resolve().parent / "sql"


def sql(name: str) -> str:
    """The text of ``dags/sql/<name>.sql``."""
    return (SQL / f"{name}.sql").read_text()


def dsn() -> str:
    """The warehouse's DSN, from its Airflow Connection."""
    from airflow_plugins.protection.config import sink_dsn

    return sink_dsn(WAREHOUSE_CONN_ID)


def prepare(target: str) -> None:
    """Creates the warehouse tables and the sink fence (idempotent)."""
    from airflow_plugins.lease import SINK_FENCE, migrate

    migrate(target, SINK_FENCE)
    with psycopg.connect(target) as conn, conn.transaction():
        conn.execute(sql("schema_lock"))  # runs starting together create them once
        conn.execute(sql("billing_schema"))
        conn.execute(sql("warehouse_schema"))
