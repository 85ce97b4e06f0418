"""The Airflow -> Temporal bridge: hand DAG runs to Temporal, dual-run them, compare, cut over.

Both engines take the same leases (``airflow_plugins.lease``, keys from
``airflow_plugins.lease.keys``), so no engine, and no mistake in configuring the two, performs a
business effect twice.

    handover = Handover(client, config.task_queue("billing"), store=store)
    got = await handover.start_or_attach(spec, "2024-02-15")     # one execution per run key

Airflow-side pieces (``bridge.in_airflow.router``, ``bridge.in_airflow.operator``,
``bridge.in_airflow.workflow_trigger``, ``bridge.in_airflow.translate``) import Airflow and are not
re-exported here; the worker is ``python -m bridge.worker``. See MIGRATION.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from airflow_plugins.old_paths import keep_old_paths

keep_old_paths("bridge")

if TYPE_CHECKING:
    from bridge.comparison import Comparison, get_comparison, ready, recent
    from bridge.config import BridgeConfig, ConfigError, TemporalUnavailable
    from bridge.cutover import (
        CutoverMode,
        ModeChange,
        ModeChangeRefused,
        ModeStore,
        UnknownMode,
        migrate_bridge,
    )
    from bridge.identity import run_key, task_lease_key, workflow_id
    from bridge.spec import (
        DagRunInput,
        DagRunResult,
        DagSpec,
        Handoff,
        RetrySpec,
        RunMode,
        TaskKind,
        TaskOutcome,
        TaskSpec,
    )
    from bridge.temporal.client import connect
    from bridge.temporal.codec import EncryptionCodec, codec_from_env, new_key
    from bridge.temporal.handover import (
        Handover,
        HandoverRefused,
        PayloadTooLarge,
        cancel,
        run_handle,
    )
    from bridge.worker.workflows import DagRunWorkflow, MappedChunkWorkflow, ScheduledDagWorkflow

_EXPORTS = {
    "BridgeConfig": "bridge.config",
    "Comparison": "bridge.comparison",
    "ConfigError": "bridge.config",
    "CutoverMode": "bridge.cutover",
    "DagRunInput": "bridge.spec",
    "DagRunResult": "bridge.spec",
    "DagRunWorkflow": "bridge.worker.workflows",
    "DagSpec": "bridge.spec",
    "EncryptionCodec": "bridge.temporal.codec",
    "Handoff": "bridge.spec",
    "Handover": "bridge.temporal.handover",
    "HandoverRefused": "bridge.temporal.handover",
    "MappedChunkWorkflow": "bridge.worker.workflows",
    "ModeChange": "bridge.cutover",
    "ModeChangeRefused": "bridge.cutover",
    "ModeStore": "bridge.cutover",
    "PayloadTooLarge": "bridge.temporal.handover",
    "RetrySpec": "bridge.spec",
    "RunMode": "bridge.spec",
    "ScheduledDagWorkflow": "bridge.worker.workflows",
    "TaskKind": "bridge.spec",
    "TaskOutcome": "bridge.spec",
    "TaskSpec": "bridge.spec",
    "TemporalUnavailable": "bridge.config",
    "UnknownMode": "bridge.cutover",
    "cancel": "bridge.temporal.handover",
    "codec_from_env": "bridge.temporal.codec",
    "connect": "bridge.temporal.client",
    "get_comparison": "bridge.comparison",
    "migrate_bridge": "bridge.cutover",
    "new_key": "bridge.temporal.codec",
    "ready": "bridge.comparison",
    "recent": "bridge.comparison",
    "run_handle": "bridge.temporal.handover",
    "run_key": "bridge.identity",
    "task_lease_key": "bridge.identity",
    "workflow_id": "bridge.identity",
}

#: names from before issue 14's renames, still answered
_RENAMED = {"task_key": "task_lease_key"}

__all__ = [
    "BridgeConfig",
    "Comparison",
    "ConfigError",
    "CutoverMode",
    "DagRunInput",
    "DagRunResult",
    "DagRunWorkflow",
    "DagSpec",
    "EncryptionCodec",
    "Handoff",
    "Handover",
    "HandoverRefused",
    "MappedChunkWorkflow",
    "ModeChange",
    "ModeChangeRefused",
    "ModeStore",
    "PayloadTooLarge",
    "RetrySpec",
    "RunMode",
    "ScheduledDagWorkflow",
    "TaskKind",
    "TaskOutcome",
    "TaskSpec",
    "TemporalUnavailable",
    "UnknownMode",
    "cancel",
    "codec_from_env",
    "connect",
    "get_comparison",
    "migrate_bridge",
    "new_key",
    "ready",
    "recent",
    "run_handle",
    "run_key",
    "task_lease_key",
    "workflow_id",
]


def __getattr__(name: str) -> Any:
    # resolved on first use, not at import: the workflow sandbox re-imports this package for
    # every workflow module it loads, and must not pull the client, psycopg or cryptography in
    name = _RENAMED.get(name, name)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
