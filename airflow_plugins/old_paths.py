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


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads it as the module at its new path."""

    def __init__(self, package: str, moved: Mapping[str, str]) -> None:
        self.package = package
        self.moved = dict(moved)

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
        return importlib.import_module(self.moved[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module is already imported."""


def keep_old_paths(package: str, moved: Mapping[str, str]) -> None:
    """Makes each old path in ``moved`` import as its new module (once per package)."""
    for finder in sys.meta_path:
        if getattr(finder, "package", None) == package and hasattr(finder, "moved"):
            return
    sys.meta_path.append(_OldPathFinder(package, moved))
