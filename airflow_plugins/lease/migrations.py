"""Applies the numbered ``.sql`` migrations of the lease store and of a sink fence.

Each migration runs in its own transaction together with its version row, under a
transaction-scoped advisory lock, so any number of processes may migrate at once: one applies
each migration, the others wait and then find it applied.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import resources

import psycopg
from psycopg import sql

from airflow_plugins.lease.errors import LeaseStoreUnavailable

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclasses.dataclass(frozen=True)
class Component:
    """A set of migrations that share one Postgres schema and one version table."""

    schema: str
    folder: str
    package: str = "airflow_plugins.lease"


LEASE_STORE = Component(schema="runlease", folder="sql/migrations")
SINK_FENCE = Component(schema="runfence", folder="sql/sink")


@dataclasses.dataclass(frozen=True)
class Migration:
    """One numbered migration file."""

    version: int
    name: str
    text: str


def migrations(component: Component) -> list[Migration]:
    """The component's migrations in version order."""
    folder = resources.files(component.package).joinpath(component.folder)
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{component.folder}: migrations must be numbered 1..n, got {versions}")
    return found


def migrate(conninfo: str, component: Component = LEASE_STORE) -> list[int]:
    """Brings the component's schema up to date; returns the versions this call applied.

    Raises:
        LeaseStoreUnavailable: Postgres could not be reached.
    """
    lock_id = sql.Literal(f"exactly-once-migrate:{component.schema}")
    versions_table = sql.Identifier(component.schema, "schema_migrations")
    applied: list[int] = []
    try:
        with psycopg.connect(conninfo, connect_timeout=10) as conn:
            for migration in migrations(component):
                with conn.transaction():
                    lock = sql.SQL("SELECT pg_advisory_xact_lock(hashtext({}))")
                    conn.execute(lock.format(lock_id))
                    conn.execute(
                        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                            sql.Identifier(component.schema)
                        )
                    )
                    conn.execute(
                        sql.SQL(
                            "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY, "
                            "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                        ).format(versions_table)
                    )
                    done = conn.execute(
                        sql.SQL("SELECT 1 FROM {} WHERE version = %s").format(versions_table),
                        (migration.version,),
                    ).fetchone()
                    if done:
                        continue
                    conn.execute(migration.text.encode())
                    conn.execute(
                        sql.SQL("INSERT INTO {} (version, name) VALUES (%s, %s)").format(
                            versions_table
                        ),
                        (migration.version, migration.name),
                    )
                    applied.append(migration.version)
    except psycopg.OperationalError as exc:
        raise LeaseStoreUnavailable(f"cannot migrate {component.schema}: {exc}") from exc
    return applied


def current_version(conninfo: str, component: Component = LEASE_STORE) -> int:
    """The highest applied version of the component (0 when none)."""
    with psycopg.connect(conninfo, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{component.schema}.schema_migrations",)
        ).fetchone()
        if not row or not row[0]:
            return 0
        got = conn.execute(
            sql.SQL("SELECT coalesce(max(version), 0) FROM {}").format(
                sql.Identifier(component.schema, "schema_migrations")
            )
        ).fetchone()
        return int(got[0]) if got else 0
