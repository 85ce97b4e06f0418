"""The README's main job at the lease level: real processes, a real frozen holder, real counts."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ADMIN_DSN


def test_replay_double_charges_without_fencing_and_blocks_it_with_the_fence() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_plugins.demo.lease_replay",
            "--dsn",
            ADMIN_DSN,
            "--customers",
            "60",
            "--freeze-after",
            "20",
            "--delay",
            "0.01",
            "--ttl",
            "1.5",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    plain, fenced = summary["without_fencing"], summary["with_fencing"]
    # today's behaviour: the re-run charges everyone again, the resumed first run goes on too
    assert plain["customers_charged_twice"] >= 20
    assert plain["charges"] > 60
    # with the lease and the fence: each customer exactly once, the resumed writer refused
    assert fenced["charges"] == 60
    assert fenced["customers_charged"] == 60
    assert fenced["customers_charged_twice"] == 0
    assert fenced["writes_refused"] >= 1
    assert summary["blocked"] is True
