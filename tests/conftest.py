"""Shared fixtures: a fresh database per test on the real Postgres server.

The server is the one at ``EXACTLY_ONCE_TEST_PG`` (default: the local one on 127.0.0.1:5432,
trust auth). Each test that asks for a database gets its own, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, LeaseStore, migrate

ADMIN_DSN = os.environ.get("EXACTLY_ONCE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def dsn_for(dbname: str) -> str:
    """The admin DSN pointed at another database of the same server."""
    return psycopg.conninfo.make_conninfo(ADMIN_DSN, dbname=dbname)


def create_database(prefix: str = "eo") -> str:
    """Creates an empty database; returns its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return dsn_for(name)


def drop_database(dsn: str) -> None:
    """Drops a database made by ``create_database``, ending its sessions first."""
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        )


@pytest.fixture
def empty_db() -> Iterator[str]:
    """A new, empty database."""
    dsn = create_database()
    try:
        yield dsn
    finally:
        drop_database(dsn)


@pytest.fixture
def lease_db(empty_db: str) -> str:
    """A new database with the lease store migrated."""
    migrate(empty_db, LEASE_STORE)
    return empty_db


@pytest.fixture
def sink_db() -> Iterator[str]:
    """A second new database (the sink: another database than the lease store), fence migrated,
    with a ``charges`` table unique on nothing, so a double charge shows up as two rows."""
    dsn = create_database("eosink")
    migrate(dsn, SINK_FENCE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE charges (id bigserial PRIMARY KEY, run_key text NOT NULL, "
            "customer text NOT NULL, token bigint, writer text, at timestamptz DEFAULT now())"
        )
    try:
        yield dsn
    finally:
        drop_database(dsn)


@pytest.fixture
def store(lease_db: str) -> Iterator[LeaseStore]:
    """A lease store on a fresh database, with a short default TTL."""
    with LeaseStore(lease_db, ttl=5.0) as s:
        yield s


def store_backends(dsn: str, application_name: str = "runlease") -> list[int]:
    """The server processes of lease-store connections open on ``dsn``'s database: a store's
    own (``application_name`` runlease), or a lease agent's (runlease-agent)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            (application_name,),
        ).fetchall()
    return [int(r[0]) for r in rows]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Adds the corpus truth check's DAG folders to the shared Airflow harness when (only when)
    its tests were selected: before any session fixture starts a stack."""
    truth = "tests.bridge.test_corpus_truth"
    modules = {getattr(getattr(item, "module", None), "__name__", "") for item in session.items}
    if truth in modules:
        from tests.bridge.test_corpus_truth import add_dag_folders

        add_dag_folders()
