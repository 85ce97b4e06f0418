"""The plugin object and the ``[exactly_once]`` options."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_plugins.lease import InvalidLeaseInput
from airflow_plugins.protection import config, listener
from airflow_plugins.protection.plugin import URL_PREFIX, ExactlyOncePlugin


# importing Airflow's API app imports starlette's test client, which warns about httpx
@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_the_plugin_registers_the_listener_and_mounts_the_pages() -> None:
    plugin = ExactlyOncePlugin()
    assert plugin.name == "exactly_once"
    assert plugin.listeners == [listener]
    apps = plugin.fastapi_apps
    assert [a["url_prefix"] for a in apps] == [URL_PREFIX]
    assert next(v["href"] for v in plugin.external_views).startswith(URL_PREFIX)


def test_options_have_documented_defaults() -> None:
    assert config.enabled() is True
    assert config.lease_conn_id() == "exactly_once_leases"
    assert config.ttl() == 60.0
    assert config.heartbeat() == 20.0
    assert config.opt_in_tag() == "exactly-once"
    assert config.horizon_days() == 400
    for name in ("enabled", "lease_conn_id", "ttl", "heartbeat", "opt_in_tag", "horizon_days"):
        assert name in config.OPTIONS


def test_every_option_is_in_the_users_options_table() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "airflow_plugin.md").read_text()
    for option in config.OPTIONS.values():
        default = f"`{option.default}`" if option.default else "*(empty)*"
        assert f"| `{option.name}` | {default}" in guide, option.name


def test_options_are_read_when_asked_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__ENABLED", "false")
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__TTL", "12")
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__OPT_IN_TAG", "billing-safe")
    assert config.enabled() is False
    assert (config.ttl(), config.heartbeat()) == (12.0, 4.0)
    assert config.opt_in_tag() == "billing-safe"
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__TTL", "soon")
    with pytest.raises(InvalidLeaseInput, match="ttl"):
        config.ttl()


def test_an_option_follows_its_environment_variable_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert config.ttl() == 60.0  # the default, now kept for this process
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__TTL", "12")
    assert config.ttl() == 12.0
    monkeypatch.delenv("AIRFLOW__EXACTLY_ONCE__TTL")
    assert config.ttl() == 60.0
    # a value naming another variable is expanded, as Airflow does
    monkeypatch.setenv("EO_TEST_LEASES", "leases_from_env")
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__LEASE_CONN_ID", "$EO_TEST_LEASES")
    assert config.lease_conn_id() == "leases_from_env"
    monkeypatch.setenv("EO_TEST_LEASES", "other_leases")
    assert config.lease_conn_id() == "other_leases"


def test_the_lease_store_dsn_comes_from_option_or_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_EXACTLY_ONCE_LEASES", "postgres://lease:s3cret@db.internal:6432/leases"
    )
    dsn = config.lease_dsn(metastore=False)
    assert "host=db.internal" in dsn
    assert "port=6432" in dsn
    assert "dbname=leases" in dsn
    # a changed Connection is read again
    monkeypatch.setenv(
        "AIRFLOW_CONN_EXACTLY_ONCE_LEASES", "postgres://lease:s3cret@db2.internal:6432/leases"
    )
    assert "host=db2.internal" in config.lease_dsn(metastore=False)
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__LEASE_DSN", "postgresql://other/db")
    assert config.lease_dsn(metastore=False) == "postgresql://other/db"


def test_no_lease_store_is_a_clear_error_on_the_scheduler_side() -> None:
    with pytest.raises(InvalidLeaseInput, match="AIRFLOW_CONN_EXACTLY_ONCE_LEASES"):
        config.lease_dsn(metastore=False)
