"""The bridge's command line follows runlease's convention: global options after the command,
JSON for scripts, one-line errors, documented exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from airflow_plugins.lease import LEASE_STORE, migrate


def bridge(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    environ.pop("AIRFLOW_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=60,
        check=False,
    )


def test_mode_set_and_get_print_json_after_the_command(empty_db: str) -> None:
    migrate(empty_db, LEASE_STORE)
    dsn = {"BRIDGE_LEASE_DSN": empty_db}
    done = bridge(
        "mode", "set", "billing_x", "shadow", "--actor", "ops", "--reason", "dual run", "--json",
        **dsn,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "dag_id": "billing_x",
        "previous": "airflow",
        "current": "shadow",
        "version": 1,
    }
    got = bridge("--json", "mode", "get", "billing_x", **dsn)
    assert json.loads(got.stdout) == {"dag_id": "billing_x", "mode": "shadow"}
    refused = bridge(
        "mode", "set", "billing_x", "temporal", "--actor", "ops", "--reason", "x", **dsn
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("bridge: error: billing_x is not ready")
    assert len(refused.stderr.strip().splitlines()) == 1
    assert json.loads(bridge("mode", "get", "billing_x", "--json", **dsn).stdout)["mode"] == (
        "shadow"
    )


def test_errors_are_one_line_with_their_exit_code() -> None:
    usage = bridge("mode", "sett")
    assert usage.returncode == 2
    assert len(usage.stderr.strip().splitlines()) == 1
    config = bridge("mode", "list", BRIDGE_LANES="billing", BRIDGE_LEASE_DSN="postgresql://x@y/z")
    assert config.returncode == 2
    assert (
        config.stderr.strip() == "bridge: error: lane 'billing' is not name:slots (e.g. billing:16)"
    )
    down = bridge("mode", "list", BRIDGE_LEASE_DSN="postgresql://postgres@127.0.0.1:1/x")
    assert down.returncode == 3
    assert len(down.stderr.strip().splitlines()) == 1
    assert "Traceback" not in down.stderr


def test_help_shows_examples_and_exit_codes() -> None:
    done = bridge("mode", "--help")
    assert done.returncode == 0
    assert "examples:\n  bridge mode set billing_nightly shadow" in done.stdout
    assert "3  unreachable" in done.stdout
