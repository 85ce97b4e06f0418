"""The routing point: does a run's protected work run here, or is it handed to another engine?

The operator asks the router once per try, before it takes any lease. The default router keeps
everything in Airflow. The bridge registers its own (``[exactly_once] router =
bridge.in_airflow.router:router`` or ``register_router``): it decides by the DAG's cutover mode
*fixed when the run started* (it pins the mode per run, so a change applies to the next run) and
returns an ``EngineHandover`` that starts or attaches to the engine's execution. This module imports
nothing from Temporal.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from airflow_plugins.lease.keys import LeaseKey

AIRFLOW = "airflow"


@dataclasses.dataclass(frozen=True)
class ProtectedRun:
    """What a router knows about the protected try asking where to run.

    Attributes:
        key: the lease key of the work.
        dag_id, run_id, task_id, map_index, try_number: the Airflow task instance.
        run_started_at: when the DAG run started (modes are pinned per run).
        conf: the DAG run's conf.
        triggering_user: who triggered the run, if known.
    """

    key: LeaseKey
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    run_started_at: datetime | None
    conf: Mapping[str, Any]
    triggering_user: str | None = None


@runtime_checkable
class EngineHandover(Protocol):
    """Runs a try's protected work on another engine instead of here."""

    def start(self, operator: Any, context: Mapping[str, Any], run: ProtectedRun) -> Any:
        """Starts (or attaches to) the work elsewhere; returns its result or defers.

        To wait without a worker slot, call ``operator.defer(trigger=...,
        method_name="resume_handover", kwargs={...})``; ``resume`` then receives the event.
        """

    def resume(
        self,
        operator: Any,
        context: Mapping[str, Any],
        run: ProtectedRun,
        event: Any,
    ) -> Any:
        """Continues after a deferral started by ``start``; returns the result or defers again."""


@dataclasses.dataclass(frozen=True)
class Route:
    """A router's answer.

    Attributes:
        mode: the cutover mode the run is pinned to (``airflow``, ``shadow``, ``temporal``, ...).
        handover: None to run the work here (Airflow primary); else who runs it.
    """

    mode: str = AIRFLOW
    handover: EngineHandover | None = None


@runtime_checkable
class Router(Protocol):
    """Decides where a protected try's work runs."""

    def route(self, run: ProtectedRun) -> Route:
        """The route of ``run``; must give the same answer for every try of one DAG run."""


class AirflowOnly:
    """The default router: every protected body runs in Airflow."""

    def route(self, run: ProtectedRun) -> Route:
        """Always ``Route()``: run here."""
        return Route()


_registered: Router | None = None


def register_router(router: Router | None) -> None:
    """Installs ``router`` for this process (None: back to the configured/default one)."""
    global _registered
    _registered = router


def current_router() -> Router:
    """The registered router, else the one named by ``[exactly_once] router``, else Airflow only.

    Raises:
        ImportError: the configured router cannot be imported (fail closed: nothing runs).
    """
    if _registered is not None:
        return _registered
    from airflow_plugins.protection import config

    path = config.router_path()
    if not path:
        return AirflowOnly()
    module_name, _, attribute = path.partition(":")
    target = getattr(importlib.import_module(module_name), attribute or "router")
    router = target() if isinstance(target, type) else target
    if not isinstance(router, Router):
        raise ImportError(f"[exactly_once] router {path!r} has no route(run) method")
    return router
