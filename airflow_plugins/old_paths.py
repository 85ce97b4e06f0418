"""Import paths from before the layout move, kept working as aliases of the modules' new homes.

DAG files import ``airflow_plugins.operators``; deferred tasks stored trigger classpaths such as
``airflow_plugins.triggers.LeaseReleasedTrigger`` in Airflow's database; ``airflow.cfg`` names
``bridge.routing:BridgeRouter``. Importing an old path yields the new module itself (the same
object, so classes, ``isinstance`` and monkeypatching agree), and imports nothing until asked.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

#: old module path -> its home since the layout move (issue 14)
MOVED: dict[str, str] = {
    "airflow_plugins.config": "airflow_plugins.protection.config",
    "airflow_plugins.decorators": "airflow_plugins.protection.decorators",
    "airflow_plugins.early_acquire": "airflow_plugins.protection.early_acquire",
    "airflow_plugins.embedded_postgres": "airflow_plugins.demo.embedded_postgres",
    "airflow_plugins.fence_context": "airflow_plugins.lease.fence",
    "airflow_plugins.keys": "airflow_plugins.lease.keys",
    "airflow_plugins.lease_store_hook": "airflow_plugins.protection.lease_store_hook",
    "airflow_plugins.listener": "airflow_plugins.protection.listener",
    "airflow_plugins.operators": "airflow_plugins.protection.operators",
    "airflow_plugins.plugin": "airflow_plugins.protection.plugin",
    "airflow_plugins.policy": "airflow_plugins.protection.policy",
    "airflow_plugins.prewarm": "airflow_plugins.protection.connection_warmup",
    "airflow_plugins.protected_try": "airflow_plugins.protection.protected_try",
    "airflow_plugins.recorded_result": "airflow_plugins.protection.recorded_result",
    "airflow_plugins.routing": "airflow_plugins.protection.routing",
    "airflow_plugins.sla": "airflow_plugins.protection.sla",
    "airflow_plugins.task_key": "airflow_plugins.protection.task_identity",
    "airflow_plugins.triggers": "airflow_plugins.protection.triggers",
    "bridge.activities": "bridge.worker.activities",
    "bridge.catalog": "bridge.worker.catalog",
    "bridge.client": "bridge.temporal.client",
    "bridge.codec": "bridge.temporal.codec",
    "bridge.egress": "bridge.worker.egress",
    "bridge.execution": "bridge.worker.execution",
    "bridge.fencing": "bridge.worker.activity_fence",
    "bridge.handoff": "bridge.in_airflow.handoff",
    "bridge.handover": "bridge.temporal.handover",
    "bridge.operator": "bridge.in_airflow.operator",
    "bridge.routing": "bridge.in_airflow.router",
    "bridge.schedule": "bridge.temporal.schedule",
    "bridge.translate": "bridge.in_airflow.translate",
    "bridge.triggers": "bridge.in_airflow.workflow_trigger",
    "bridge.workflows": "bridge.worker.workflows",
}


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads it as the module at its new path."""

    def __init__(self, package: str, moved: Mapping[str, str]) -> None:
        self.package = package
        self.moved = dict(moved)
        self._own_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.moved[spec.name])
        # the import system sets the alias's spec on the module: keep its own to put back
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the new module is imported already); its own spec is put back, so
        ``importlib.reload`` of the new module still reloads it."""
        own = self._own_specs.pop(module.__spec__.name if module.__spec__ else "", None)
        if own is not None:
            module.__spec__ = own
            module.__loader__ = own.loader


def keep_old_paths(package: str) -> None:
    """Makes each old path of ``package`` in ``MOVED`` import as its new module (once)."""
    for finder in sys.meta_path:
        if getattr(finder, "package", None) == package and hasattr(finder, "moved"):
            return
    moved = {old: new for old, new in MOVED.items() if old.startswith(package + ".")}
    sys.meta_path.append(_OldPathFinder(package, moved))
