"""Runs a handover from an Airflow task process in a short-lived child process.

temporalio's runtime can abort the interpreter at exit (SIGABRT in PyGILState_Release); an
Airflow task process that exits with a signal is marked failed even after it deferred. So the
task process never loads the Temporal client: it sends the request (JSON on stdin) to
``python -m bridge.cli handover``, which answers with JSON on stdout and leaves with
``os._exit``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from airflow_plugins.lease import InvalidLeaseInput
from bridge.config import BridgeConfig, TemporalUnavailable
from bridge.spec import AirflowRun, DagSpec, Handoff, RunMode

log = logging.getLogger(__name__)

TIMEOUT_S = 120.0
#: The XCom key under which a handed-over task records its workflow id (read by the plugin's
#: handover page, ``airflow_plugins.views.handover``, to show the run's tasks from Temporal).
XCOM_KEY = "bridge_workflow_id"


class HandoverFailed(RuntimeError):
    """The handover process failed for a reason other than the ones below."""


#: Fire-and-forget handover processes (shadow starts) of this process not yet seen ending.
_fired: list[subprocess.Popen[bytes]] = []


def resolved_config() -> BridgeConfig:
    """The bridge's settings as the handover child gets them (the lease store resolved)."""
    # resolved here, in the Airflow process: the child must not import Airflow's core (an
    # Airflow task's environment does not let it initialise), so it gets everything it needs
    config = BridgeConfig.load()
    if config.lease_dsn:
        return config
    from airflow_plugins.protection.config import lease_dsn

    return dataclasses.replace(config, lease_dsn=lease_dsn())


def request(
    spec: DagSpec,
    business_date: str,
    *,
    mode: RunMode = RunMode.PRIMARY,
    part: str | None = None,
    map_key: str | None = None,
    source: str = "",
    wait: bool = True,
    partition: tuple[str, str | None] | None = None,
    run: AirflowRun | None = None,
) -> Handoff | None:
    """Hands a run over through the child process.

    Args:
        wait: False for a shadow start that must not delay Airflow: fire and forget.
        partition: the Airflow run's partition key and date (ISO), from ``run_partition``.
        run: the Airflow run handed over (``airflow_run``): its tasks' ``dag_run`` in Temporal.

    Raises:
        TemporalUnavailable: Temporal did not answer; nothing was started.
        InvalidLeaseInput: the run was refused (untranslatable, too large, bad input).
        HandoverFailed: anything else.
    """
    config = resolved_config()
    body = json.dumps(
        {
            "config": dataclasses.asdict(config),
            "spec": dataclasses.asdict(spec),
            "business_date": business_date,
            "mode": mode.value,
            "part": part,
            "map_key": map_key,
            "source": source,
            "partition_key": partition[0] if partition else None,
            "partition_date": partition[1] if partition else None,
            "airflow_run": dataclasses.asdict(run) if run else None,
        }
    )
    command = [sys.executable, "-m", "bridge.cli", "handover"]
    if not wait:
        # not waited for: it outlives this try if it must (a shadow start never blocks Airflow)
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True
        )
        assert proc.stdin is not None
        proc.stdin.write(body.encode())
        proc.stdin.close()
        # kept until it ends (reaped by a later call): dropped while running, it would be
        # reported as a leaked process and left a zombie
        _fired[:] = [p for p in _fired if p.poll() is None] + [proc]
        return None
    done = subprocess.run(
        command, input=body.encode(), capture_output=True, timeout=TIMEOUT_S, env=dict(os.environ)
    )
    try:
        answer = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise HandoverFailed(
            f"handover process exited {done.returncode}: {done.stderr.decode()[-2000:]}"
        ) from exc
    if answer.get("ok"):
        return Handoff(
            answer["workflow_id"], answer["run_id"], answer["started"], answer.get("recorded")
        )
    kind, message = answer.get("error_type"), str(answer.get("error"))
    if kind == "TemporalUnavailable":
        raise TemporalUnavailable(message)
    if kind in (
        "HandoverRefused",
        "PayloadTooLarge",
        "InvalidLeaseInput",
        "InvalidPartition",
        "UntranslatableDag",
    ):
        raise InvalidLeaseInput(message)
    raise HandoverFailed(f"{kind}: {message}")


def airflow_run(context: Mapping[str, Any]) -> AirflowRun | None:
    """The Airflow run in ``context`` as the handover carries it (its type, conf and data
    interval: what ``LatestOnlyOperator`` and ``dag_run.conf`` read); None without a run."""
    dag_run = context.get("dag_run")
    if dag_run is None:
        return None

    def iso(name: str) -> str | None:
        value = getattr(dag_run, name, None)
        return value.isoformat() if value is not None else None

    run_type = getattr(dag_run, "run_type", None)
    return AirflowRun(
        run_type=str(getattr(run_type, "value", run_type)),
        conf=dict(getattr(dag_run, "conf", None) or {}),
        data_interval_start=iso("data_interval_start"),
        data_interval_end=iso("data_interval_end"),
        logical_date=iso("logical_date"),
    )


def run_partition(context: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """The asset partition of the Airflow run in ``context``: its key, and its date as Airflow
    resolves it (``bridge.partition.resolve``, ISO); None for a run without one.

    Raises:
        InvalidPartition: a key the DAG's timetable rejects (nothing is handed over).
    """
    from bridge.partition import resolve

    key = getattr(context.get("dag_run"), "partition_key", None)
    if key is None:
        return None
    resolved = resolve(context["dag"], key)
    return key, resolved.isoformat() if resolved is not None else None


def record_workflow(context: Mapping[str, Any], workflow_id: str) -> None:
    """Records in XCom the workflow that runs this task's work (Airflow's per-task view of a
    handed-over run starts from it); never fatal: the handover itself matters more."""
    push = getattr(context.get("ti"), "xcom_push", None)
    if push is None:
        return  # a context without a task instance (the operator driven outside Airflow)
    try:
        push(key=XCOM_KEY, value=workflow_id)
    except Exception as exc:
        log.warning("bridge: could not record workflow %s in XCom: %s", workflow_id, exc)
