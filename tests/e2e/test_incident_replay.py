"""The README's main command, ``exactly-once-demo``: the incident replayed on real Airflow twice
(plugin disabled, then enabled), printed side by side, last line one JSON object.

Run here on the test Postgres server (``--dsn``) instead of the embedded default, with the
owning scheduler SIGKILLed; the embedded default is what a user gets with no arguments.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ADMIN_DSN


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_shows_double_charges_without_the_plugin_and_none_with_it() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_plugins.demo.replay",
            "--dsn",
            ADMIN_DSN,
            "--delay",
            "0.15",
            "--signal",
            "SIGKILL",
        ],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "plugin disabled" in lines[0]
    assert "plugin enabled" in lines[0]
    figures = json.loads(lines[-1])
    without, with_ = figures["without_plugin"], figures["with_plugin"]
    assert figures["customers"] == 340
    assert without["double_charged"] > 0
    assert without["charges"] > 340
    assert without["duplicate_cents"] > 0
    assert with_["charges"] == 340
    # the incident's own metric: charges created at the payment processor
    assert with_["processor_charges"] == 340
    assert with_["processor_customers_twice"] == 0
    assert without["processor_charges"] > 340
    assert without["processor_customers_twice"] > 0
    assert with_["double_charged"] == 0
    assert with_["missed"] == 0
    assert with_["duplicate_cents"] == 0
    assert with_["tries"] >= 2, "the standby never re-ran the task: nothing was replayed"
    assert without["tries"] >= 2
