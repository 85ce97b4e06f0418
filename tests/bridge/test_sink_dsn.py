"""The bridge worker resolves a sink connection as Airflow's tasks do: one resolver, extras kept."""

from __future__ import annotations

import json

import psycopg
import pytest

from airflow_plugins.lease.errors import SinkNotConfigured
from airflow_plugins.protection.config import sink_dsn as airflow_sink_dsn
from bridge.worker.activity_fence import sink_dsn as worker_sink_dsn


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://billing:s3cret@db.internal:6432/billing?sslmode=verify-full",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "db.internal",
                "port": 6432,
                "login": "billing",
                "password": "s3cret",
                "schema": "billing",
                "extra": {"sslmode": "verify-full"},
            }
        ),
    ],
    ids=["uri", "json"],
)
def test_the_worker_keeps_a_connections_extras_like_airflow_does(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BILLING_DB", value)
    worker = psycopg.conninfo.conninfo_to_dict(worker_sink_dsn("billing_db"))
    assert worker == psycopg.conninfo.conninfo_to_dict(airflow_sink_dsn("billing_db"))
    assert worker["sslmode"] == "verify-full"
    assert (worker["host"], worker["port"], worker["dbname"]) == ("db.internal", "6432", "billing")


def test_a_libpq_string_is_taken_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BILLING_DB", "host=db.internal dbname=billing")
    assert worker_sink_dsn("billing_db") == "host=db.internal dbname=billing"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "set AIRFLOW_CONN_BILLING_DB"),
        ("mysql://u:p@db/billing", "'mysql' connection, not Postgres"),
    ],
)
def test_a_missing_or_foreign_sink_is_a_clear_error(
    value: str | None, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_BILLING_DB", raising=False)
    if value is not None:
        monkeypatch.setenv("AIRFLOW_CONN_BILLING_DB", value)
    with pytest.raises(SinkNotConfigured, match=message):
        worker_sink_dsn("billing_db")
