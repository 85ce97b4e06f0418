"""The package as an Airflow provider: what ``airflow providers list``, ``airflow config`` and
``airflow plugins`` show, run as a user runs them (the venv's real ``airflow`` CLI)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import airflow
import jsonschema
import pytest

from airflow_plugins.protection import config
from airflow_plugins.provider_info import PACKAGE, get_provider_info
from bridge import config as bridge_config

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


def _airflow(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW__EXACTLY_ONCE__", "AIRFLOW__BRIDGE__", "BRIDGE_"))
    }
    environ.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False", **env)
    done = subprocess.run(
        [AIRFLOW, *args], capture_output=True, text=True, env=environ, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done


def test_the_provider_info_is_valid_and_declares_every_option() -> None:
    info = get_provider_info()
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    sections = info["config"]
    assert set(sections["exactly_once"]["options"]) == set(config.OPTIONS)
    assert set(sections["bridge"]["options"]) == {s.option for s in bridge_config.SETTINGS}
    for section in sections.values():
        for name, option in section["options"].items():
            assert option["description"], name
            assert option["type"] in ("string", "boolean", "integer", "float"), name
            assert "default" in option
            assert "example" in option
    assert sections["exactly_once"]["options"]["lease_dsn"]["sensitive"] is True
    assert sections["bridge"]["options"]["lease_dsn"]["sensitive"] is True


def test_bridge_defaults_are_the_declared_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in bridge_config.SETTINGS:
        monkeypatch.delenv(setting.env, raising=False)
    monkeypatch.delenv("AIRFLOW_HOME", raising=False)
    monkeypatch.delenv("AIRFLOW_CONFIG", raising=False)
    loaded = dataclasses.asdict(bridge_config.BridgeConfig.load())
    for setting in bridge_config.SETTINGS:
        value = loaded[setting.option]
        if setting.option == "lanes":
            value = ",".join(f"{k}:{v}" for k, v in value.items())
        expected = setting.type(setting.default) if setting.default else None
        assert value == expected, setting.option


def test_airflow_lists_the_provider_its_config_and_the_plugin(tmp_path: Path) -> None:
    providers = json.loads(_airflow(tmp_path, "providers", "list", "-o", "json").stdout)
    assert PACKAGE in [p["package_name"] for p in providers]

    listed = _airflow(
        tmp_path, "config", "list", "--section", "exactly_once", "--show-values"
    ).stdout
    assert "[exactly_once]" in listed
    for name, option in config.OPTIONS.items():
        assert f"\n{name} = {option.default}" in listed, name

    ttl = _airflow(
        tmp_path, "config", "get-value", "exactly_once", "ttl", AIRFLOW__EXACTLY_ONCE__TTL="30"
    )
    assert ttl.stdout.strip() == "30"

    plugins = json.loads(_airflow(tmp_path, "plugins", "-o", "json").stdout)
    ours = [p for p in plugins if p["name"] == "exactly_once"]
    assert len(ours) == 1
    assert ours[0]["listeners"] == ["airflow_plugins.protection.listener"]
