"""``bridge mode set DAG shadow`` refuses a DAG whose tasks Temporal would run with effects.

Shadow runs Temporal beside Airflow: a protected (fenced) task's writes are captured and rolled
back, a task the DAG declares side-effect-free (tag ``side-effect-free`` or
``side-effect-free:<task_id>``) just runs. Any other task Temporal would run has effects nobody
rolls back, so the mode change is refused with those tasks named, before anything runs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.bridge.conftest import REPO

DAGS = """
import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, task

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import exactly_once_task
from bridge.in_airflow.operator import BridgeOperator

START = pendulum.datetime(2024, 1, 1, tz="UTC")


def ordinary(dag_id, tags):
    with DAG(dag_id, schedule="0 2 * * *", start_date=START, tags=tags) as dag:

        @task
        def extract() -> list:
            return [1, 2]

        extract() >> BashOperator(task_id="notify", bash_command="echo sent")
    return dag


undeclared = ordinary("gate_undeclared", ["side-effect-free:extract"])
declared = ordinary("gate_declared", ["side-effect-free:extract", "side-effect-free:notify"])
whole = ordinary("gate_whole", ["side-effect-free"])

with DAG("gate_protected", schedule="0 2 * * *", start_date=START):

    @exactly_once_task(sink_conn_id="billing_db")
    def charge(fence: Fence) -> int:
        return 1

    # only the protected task is shadowed (the router); notify runs in Airflow alone
    BashOperator(task_id="notify", bash_command="echo sent") >> charge()

with DAG("gate_mixed", schedule="0 2 * * *", start_date=START,
         tags=["side-effect-free:extract", "side-effect-free:notify"]):
    @exactly_once_task(sink_conn_id="billing_db")
    def charge(fence: Fence, rows: list) -> int:
        return len(rows)

    # every task fenced or declared: the whole DAG is shadowed, once per business run
    @task
    def extract() -> list:
        return [1, 2]

    charge(extract()) >> BashOperator(task_id="notify", bash_command="echo sent")

with DAG("gate_graph", schedule=None, start_date=START, tags=["side-effect-free:extract"]) as g:

    @task
    def extract() -> list:
        return [1, 2]

    @task
    def load(rows: list) -> int:
        return len(rows)

    load(extract())

with DAG("gate_driver", schedule=None, start_date=START):
    BridgeOperator(task_id="run_in_temporal", source_dag=g)
"""


@pytest.fixture(scope="module")
def dags_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gate-dags")
    (folder / "gate_dags.py").write_text(textwrap.dedent(DAGS))
    return folder


def _mode_set(dsn: str, folder: Path, dag_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", "mode", "set", dag_id, "shadow", "--actor", "ops",
         "--reason", "dual run", "--dags-folder", str(folder), *extra],
        cwd=REPO, env={"BRIDGE_LEASE_DSN": dsn, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_shadow_is_refused_naming_the_tasks_temporal_would_run_with_effects(
    dags_folder: Path,
) -> None:
    from bridge.in_airflow.shadow_gate import shadow_refusals_of, shadow_route, shadow_tasks
    from bridge.worker.catalog import TaskCatalog

    catalog = TaskCatalog(str(dags_folder))
    catalog.load()
    dags = {d: catalog.dag(d) for d in (
        "gate_undeclared", "gate_declared", "gate_whole", "gate_protected", "gate_graph",
        "gate_driver", "gate_mixed",
    )}  # fmt: skip

    def refused(dag_id: str) -> list[str]:
        return [r.split(":")[0] for r in shadow_refusals_of(dags[dag_id], dags.values())]

    assert refused("gate_undeclared") == ["notify"]
    assert [shadow_route(dags[d], dags.values()) for d in ("gate_whole", "gate_protected",
                                                           "gate_graph", "gate_mixed")] == [
        "none", "protected", "bridge-operator", "whole"
    ]  # fmt: skip
    assert sorted(t.task_id for t in shadow_tasks(dags["gate_mixed"], dags.values())) == [
        "charge",
        "extract",
        "notify",
    ]
    assert refused("gate_mixed") == []
    assert refused("gate_declared") == []
    assert refused("gate_whole") == []
    assert [t.task_id for t in shadow_tasks(dags["gate_protected"], dags.values())] == ["charge"]
    assert refused("gate_protected") == []  # the fenced task is captured and rolled back
    assert refused("gate_graph") == ["load"]  # the tasks the driver's BridgeOperator hands over
    assert [t.task_id for t in shadow_tasks(dags["gate_graph"], dags.values())] == [
        "extract",
        "load",
    ]


def test_mode_set_shadow_refuses_an_undeclared_effect_and_accepts_a_declared_dag(
    bridge_db: str, dags_folder: Path
) -> None:
    done = _mode_set(bridge_db, dags_folder, "gate_undeclared")
    assert done.returncode == 1, done.stderr
    # (Airflow's DagBag logs its parse on stderr before it)
    assert done.stderr.strip().splitlines()[-1] == (
        "bridge: error: gate_undeclared: shadow refused, Temporal would run these tasks with "
        "effects: notify: writes outside a fence (tag the DAG side-effect-free:notify if it has "
        "no effect, or make it a protected task with a sink)"
    )
    assert done.stdout == ""
    done = _mode_set(bridge_db, dags_folder, "gate_declared")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gate_declared: airflow -> shadow (v1)"
    # accepted, and told the truth: nothing hands this DAG's runs to Temporal yet
    assert "note: gate_declared has no protected task and no BridgeOperator" in done.stderr


@pytest.mark.parametrize(("tags", "refused"), [([], True), (["side-effect-free:in_venv"], False)])
def test_a_virtualenv_task_is_shadowed_only_when_declared_side_effect_free(
    tags: list[str], refused: bool
) -> None:
    import pendulum
    from airflow.sdk import DAG, task

    from bridge.in_airflow.shadow_gate import shadow_refusals_of

    start = pendulum.datetime(2024, 1, 1, tz="UTC")
    with DAG("gate_venv", schedule=None, start_date=start, tags=tags) as dag:

        @task.virtualenv(requirements=["colorama==0.4.0"])
        def in_venv() -> None:
            pass

        in_venv()
    found = shadow_refusals_of(dag)
    # its pip install and callable run in a process the egress guard cannot see into: the
    # gate refuses it like any task writing outside a fence, unless the DAG declares it free
    assert [r.split(":")[0] for r in found] == (["in_venv"] if refused else []), found
    assert all("writes outside a fence" in r for r in found), found


def test_mode_set_shadow_says_whether_protected_tasks_are_shadowed_whole_or_alone(
    bridge_db: str, dags_folder: Path
) -> None:
    done = _mode_set(bridge_db, dags_folder, "gate_mixed")
    assert done.returncode == 0, done.stderr
    assert "note: gate_mixed mixes protected tasks with side-effect-free ones" in done.stderr
    # notify is not declared: only the protected charge is shadowed, and the note says why
    done = _mode_set(bridge_db, dags_folder, "gate_protected")
    assert done.returncode == 0, done.stderr
    assert (
        "note: gate_protected is shadowed one protected task at a time (notify would run with "
        "effects in a whole-DAG shadow; were they declared side-effect-free, the whole DAG "
        "would be shadowed)" in done.stderr
    )


def _mixed(tags: list[str]) -> object:
    """``route_fixed``: extract -> protected charge -> report; whole when both are declared."""
    import pendulum
    from airflow.sdk import DAG, task

    from airflow_plugins.lease.fence import Fence
    from airflow_plugins.protection.decorators import exactly_once_task

    start = pendulum.datetime(2024, 1, 1, tz="UTC")
    with DAG("route_fixed", schedule="0 2 * * *", start_date=start, tags=tags) as dag:

        @task
        def extract() -> list[int]:
            return [1, 2]

        @exactly_once_task(sink_conn_id="billing_db")
        def charge(fence: Fence, rows: list[int]) -> int:
            return len(rows)

        @task
        def report(n: int) -> None:
            print(n)

        report(charge(rows=extract()))
    return dag


def test_a_business_runs_shadow_route_stays_as_its_first_task_fixed_it(
    bridge_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DAG file changed mid-run (a task's side-effect-free tag dropped) must not give the run
    a per-task shadow beside the whole-DAG one it already has: the route is fixed per run."""
    from airflow_plugins.lease import LeaseStore
    from bridge.cutover import ModeStore, migrate_bridge
    from bridge.in_airflow.shadow_gate import shadow_route
    from bridge.in_airflow.whole_shadow import fixed_route

    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__LEASE_DSN", bridge_db)
    migrate_bridge(bridge_db)
    declared, changed = _mixed(["side-effect-free:extract", "side-effect-free:report"]), _mixed([])
    assert (shadow_route(declared), shadow_route(changed)) == ("whole", "protected")
    with LeaseStore(bridge_db) as store:
        modes = ModeStore(store)
        modes.set("route_fixed", "shadow", actor="ops", reason="dual run")
        with pytest.raises(LookupError, match="its mode is not fixed yet"):
            fixed_route(declared, "2024-03-01")
        for day in ("2024-03-01", "2024-03-02"):
            assert modes.fix_for_business_run("route_fixed", day).value == "shadow"
        assert fixed_route(declared, "2024-03-01") == "whole"  # the run's root task
        assert fixed_route(changed, "2024-03-01") == "whole"  # its charge, after the change
        assert fixed_route(changed, "2024-03-02") == "task"  # the next run: the new file's route
        assert fixed_route(declared, "2024-03-02") == "task"
