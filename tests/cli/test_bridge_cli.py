"""The bridge's command line follows runlease's convention: global options after the command,
JSON for scripts, one-line errors, documented exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from airflow_plugins.lease import LEASE_STORE, LeaseStore, migrate
from bridge.comparison import CompareInput, ComparisonRow, compare_run, store_comparison
from bridge.cutover import ModeStore, migrate_bridge
from bridge.spec import DagRunResult, DagSpec, RunMode, TaskOutcome, TaskSpec


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
        "--force",  # no DAG folder here: the shadow gate (tests/bridge/test_shadow_gate.py)
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


def _compared(dsn: str, dag_id: str, business_date: str, *, matched: bool) -> None:
    """One compared shadow run of ``dag_id``, as the comparison activity stores it."""
    with LeaseStore(dsn) as store:
        store_comparison(
            store,
            ComparisonRow(
                dag_id=dag_id, business_date=business_date,
                primary_status="success", primary_ms=900,
                shadow_status="success", shadow_ms=700,
                differences=[] if matched else [{"what": "output", "task": "charge"}],
                primary_digests={"charge": "a1"},
                shadow_digests={"charge": "a1" if matched else "b2"},
            ),
        )  # fmt: skip


def test_cutover_refusal_says_what_the_shadow_runs_lack(empty_db: str) -> None:
    migrate(empty_db, LEASE_STORE)
    migrate_bridge(empty_db)
    env = {"BRIDGE_LEASE_DSN": empty_db, "BRIDGE_READY_AFTER": "3"}
    shadow = ("mode", "set", "ready_x", "shadow", "--actor", "ops", "--reason", "dual run")
    assert bridge(*shadow, "--force", **env).returncode == 0  # no DAG folder: past the gate

    def cut_over() -> str:
        done = bridge(
            "mode", "set", "ready_x", "temporal", "--actor", "ops", "--reason", "cut over", **env
        )
        assert done.returncode == 1, done.stdout
        assert len(done.stderr.strip().splitlines()) == 1
        return done.stderr.strip()

    assert cut_over() == (
        "bridge: error: ready_x is not ready to cut over: no shadow run has been compared yet; "
        "run 3 in shadow first (see `bridge compare ready_x`), or --force"
    )
    _compared(empty_db, "ready_x", "2026-11-01", matched=True)
    _compared(empty_db, "ready_x", "2026-11-02", matched=True)
    assert "2 of the 3 shadow runs it needs have been compared (all matched); run 1 more" in (
        cut_over()
    )
    _compared(empty_db, "ready_x", "2026-11-03", matched=False)
    _compared(empty_db, "ready_x", "2026-11-04", matched=True)
    assert "its shadow run of 2026-11-03 diverged from Airflow's" in cut_over()
    compared = bridge("compare", "ready_x", "--json", **env)
    assert json.loads(compared.stdout.splitlines()[-1]) == {
        "dag_id": "ready_x", "ready": False, "needs": 3,
        "why": "its shadow run of 2026-11-03 diverged from Airflow's; it needs 3 matching shadow "
        "runs in a row after the last diverging one",
    }  # fmt: skip
    for day in ("2026-11-05", "2026-11-06"):
        _compared(empty_db, "ready_x", day, matched=True)
    done = bridge(
        "mode", "set", "ready_x", "temporal", "--actor", "ops", "--reason", "3 matching runs", **env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ready_x: shadow -> temporal (v2)"


def test_compare_shows_a_finished_shadow_whose_comparison_waits_and_why(empty_db: str) -> None:
    """A shadow finished before its primary: no row to compare yet, but the wait and its reason
    are shown, and go once the comparison is stored."""
    migrate(empty_db, LEASE_STORE)
    migrate_bridge(empty_db)
    spec = DagSpec(dag_id="waits_x", tasks=(TaskSpec(task_id="charge", callable_ref="m:f"),))
    shadow = DagRunResult(
        "waits_x", "2026-11-07", RunMode.SHADOW, "success", {"charge": TaskOutcome("succeeded")}
    )
    with LeaseStore(empty_db) as store:
        assert compare_run(store, CompareInput(spec, shadow)).pending  # no primary lease yet
    env = {"BRIDGE_LEASE_DSN": empty_db, "BRIDGE_READY_AFTER": "3"}
    shown = bridge("compare", "waits_x", **env)
    assert shown.returncode == 0, shown.stderr
    pending, reason, verdict = shown.stdout.splitlines()
    assert pending.startswith("2026-11-07\tpending since ")
    assert reason == "    the primary has not finished charge"
    assert json.loads(verdict)["why"].endswith(
        "; the comparison of 2026-11-07 is pending: the primary has not finished charge"
    )
    [wait, _] = bridge("compare", "waits_x", "--json", **env).stdout.splitlines()
    assert json.loads(wait)["pending"] is True
    _compared(empty_db, "waits_x", "2026-11-07", matched=True)
    after = bridge("compare", "waits_x", **env).stdout
    assert after.startswith("2026-11-07\tmatch\t")
    assert "pending" not in after


SCHEDULED_DAGS = """
from datetime import datetime
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, task

with DAG("nightly_ok", schedule="0 2 * * *", start_date=datetime(2024, 1, 1), catchup=False):
    @task
    def total():
        return 1

    total()

with DAG("nightly_chain", schedule="0 2 * * *", start_date=datetime(2024, 1, 1), catchup=False):
    TriggerDagRunOperator(task_id="next_dag", trigger_dag_id="nightly_ok")
"""


def _mode_history(dsn: str, dag_id: str) -> list[tuple[str, str]]:
    with LeaseStore(dsn) as store:
        return [(r["input"]["from"], r["output"]["to"]) for r in store.history(f"{dag_id}/cutover")]


def test_temporal_scheduled_changes_nothing_until_its_schedule_exists(
    empty_db: str, tmp_path: Path
) -> None:
    """Entering temporal-scheduled: a DAG that does not translate is refused, and a Temporal
    that cannot make the Schedule fails the command, both before any change (before the fix
    the mode changed first and was left in temporal-scheduled with nothing scheduling it).
    Leaving it with Temporal down still rolls back: the mode changes and the command succeeds,
    naming the Schedule left to delete."""
    migrate(empty_db, LEASE_STORE)
    migrate_bridge(empty_db)
    (tmp_path / "nightly.py").write_text(SCHEDULED_DAGS)
    env = {
        "BRIDGE_LEASE_DSN": empty_db,
        "BRIDGE_DAGS_FOLDER": str(tmp_path),
        "BRIDGE_TEMPORAL_ADDR": "127.0.0.1:1",  # nothing listens: the Schedule cannot be made
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    with LeaseStore(empty_db) as store:
        for dag_id in ("nightly_ok", "nightly_chain"):
            for mode in ("shadow", "temporal"):
                ModeStore(store).set(dag_id, mode, actor="ops", reason="setup", force=True)
    common = ("--actor", "ops", "--reason", "schedule in temporal", "--no-airflow-pause")
    refused = bridge("mode", "set", "nightly_chain", "temporal-scheduled", *common, **env)
    assert refused.returncode == 1, refused.stderr
    assert "bridge: error: nightly_chain" in refused.stderr
    assert "next_dag" in refused.stderr
    setup = [("airflow", "shadow"), ("shadow", "temporal")]
    assert _mode_history(empty_db, "nightly_chain") == setup

    unreachable = bridge("mode", "set", "nightly_ok", "temporal-scheduled", *common, **env)
    assert unreachable.returncode == 3, unreachable.stderr  # Temporal unreachable
    assert "bridge: error: Temporal at 127.0.0.1:1 is unreachable" in unreachable.stderr
    assert bridge("--json", "mode", "get", "nightly_ok", **env).stdout.strip() == (
        '{"dag_id": "nightly_ok", "mode": "temporal"}'
    )
    assert _mode_history(empty_db, "nightly_ok") == setup

    with LeaseStore(empty_db) as store:  # as if the Schedule had been made earlier
        ModeStore(store).set("nightly_ok", "temporal-scheduled", actor="ops", reason="setup")
    rollback = bridge(
        "--json", "mode", "set", "nightly_ok", "temporal", *common[:2], "--reason=-rollback",
        "--no-airflow-pause", **env,
    )  # fmt: skip
    assert rollback.returncode == 0, rollback.stderr
    answer = json.loads(rollback.stdout.strip().splitlines()[-1])
    assert (answer["previous"], answer["current"]) == ("temporal-scheduled", "temporal")
    assert answer["schedule_left"] == "bridge-schedule:nightly_ok"
    assert "temporal schedule delete --schedule-id bridge-schedule:nightly_ok" in rollback.stderr
    assert _mode_history(empty_db, "nightly_ok")[-1] == ("temporal-scheduled", "temporal")
