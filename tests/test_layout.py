"""The layout's promises: the core loads neither engine, a task process never loads Temporal,
and every import path from before the move still names the same module."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import bridge  # noqa: F401  (installs the bridge's old import paths)
from airflow_plugins.old_paths import MOVED


def _loaded_after(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after running ``code``."""
    report = "import json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    probe = f"{code}\n{report}"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_core_imports_neither_airflow_nor_temporal() -> None:
    loaded = _loaded_after(
        "import importlib, pkgutil, airflow_plugins.lease as core\n"
        "for m in pkgutil.walk_packages(core.__path__, 'airflow_plugins.lease.'):\n"
        "    importlib.import_module(m.name)"
    )
    assert "airflow_plugins" in loaded
    assert not loaded & {"airflow", "temporalio"}


def test_what_a_task_process_loads_leaves_temporal_out() -> None:
    loaded = _loaded_after(
        "import importlib, pkgutil, airflow_plugins.protection as p, bridge.in_airflow as b\n"
        "for pkg, prefix in ((p, 'airflow_plugins.protection.'), (b, 'bridge.in_airflow.')):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, prefix):\n"
        "        importlib.import_module(m.name)\n"
        "import bridge, bridge.cutover, bridge.comparison, bridge.identity, bridge.graph\n"
        "import airflow_plugins.views, airflow_plugins.watcher"
    )
    assert "airflow" in loaded  # the probe did load the Airflow side
    assert "temporalio" not in loaded


#: what users' files and Airflow's database name: DAG files, stored trigger classpaths, airflow.cfg
USER_FACING = {
    "airflow_plugins.operators",
    "airflow_plugins.decorators",
    "airflow_plugins.fence_context",
    "airflow_plugins.triggers",
    "airflow_plugins.policy",
    "airflow_plugins.plugin",
    "bridge.routing",
    "bridge.triggers",
    "bridge.operator",
}


def test_every_user_facing_old_path_is_kept() -> None:
    assert USER_FACING <= MOVED.keys()


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_import_path_is_the_module_at_its_new_home(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)


@pytest.mark.parametrize(
    ("stored", "new"),
    [
        (
            "airflow_plugins.triggers.LeaseReleasedTrigger",
            "airflow_plugins.protection.triggers.LeaseReleasedTrigger",
        ),
        (
            "airflow_plugins.triggers.LeaseStoreReachableTrigger",
            "airflow_plugins.protection.triggers.LeaseStoreReachableTrigger",
        ),
        ("bridge.triggers.WorkflowTrigger", "bridge.in_airflow.workflow_trigger.WorkflowTrigger"),
        ("bridge.routing:BridgeRouter", "bridge.in_airflow.router:BridgeRouter"),
    ],
)
def test_a_stored_classpath_from_before_the_move_still_loads(stored: str, new: str) -> None:
    from airflow.sdk._shared.module_loading import import_string

    def load(path: str) -> object:
        return import_string(path.replace(":", "."))

    assert load(stored) is load(new)


def test_the_dag_file_imports_the_docs_teach_work_from_a_fresh_interpreter() -> None:
    code = (
        "from airflow_plugins.operators import ExactlyOnceOperator\n"
        "from airflow_plugins.decorators import exactly_once_task\n"
        "from airflow_plugins.fence_context import Fence, FenceStopped\n"
        "from airflow_plugins.protection.operators import ExactlyOnceOperator as New\n"
        "assert ExactlyOnceOperator is New"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_importing_an_old_path_leaves_the_new_module_its_own_spec() -> None:
    old = importlib.import_module("airflow_plugins.sla")
    assert old.__spec__ is not None
    assert old.__spec__.name == "airflow_plugins.protection.sla"
    assert importlib.reload(old) is old  # a reload finds and re-runs the real file


def test_the_names_of_the_old_bridge_worker_module_still_answer() -> None:
    from bridge.worker import WORKFLOWS, build_workers, main
    from bridge.worker.lanes import WORKFLOWS as lanes_workflows

    assert WORKFLOWS is lanes_workflows
    assert callable(build_workers)
    assert callable(main)
