"""The whole-DAG shadow of a DAG: started from its run's first tasks, in Airflow.

An ordinary DAG (no protected task, no ``BridgeOperator``), or one that mixes protected tasks
with ordinary ones, all fenced or declared side-effect-free (``shadow_gate.shadow_route``:
``whole``), in ``shadow`` mode: each of its Airflow business runs also gets a Temporal shadow of
the whole graph (every task, the same business date, templates rendered as Airflow renders them
for this run). The shadow captures and rolls back fenced writes, records its external calls
without sending them, refuses egress, runs tasks declared ``side-effect-free`` for real
(``bridge.worker``), and then compares itself with the Airflow run task by task through
Airflow's REST API (``bridge.task_comparison``, ``bridge.airflow_side``), its fenced tasks' items
and calls with the primary's ledger (``bridge.comparison``).

It is started when a root task of the run starts (an ordinary one by the plugin's listener, a
protected one by the router's shadow handover), in the task's own process (never the
scheduler's): the mode is fixed for the business run there (``ModeStore.fix_for_business_run``,
so a mode change mid-run never makes two primaries), and the start is a detached child process
(``handoff.request(wait=False)``): never waited for, never fatal to Airflow's run. Its route
(whole, or per protected task) is fixed per business run as well (``fixed_route``). Every root
task fires it; the workflow id is the business run's, so the second start attaches instead of
starting another.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_plugins.lease.keys import split_partition
from bridge.airflow_side import SOURCE_PREFIX
from bridge.cutover import CutoverMode, mode_store
from bridge.in_airflow import handoff
from bridge.in_airflow.refusals import class_names
from bridge.in_airflow.shadow_gate import shadowed_whole
from bridge.in_airflow.translate import UntranslatableDag, translate
from bridge.spec import RunMode

log = logging.getLogger(__name__)
WHOLE = "whole"


def start_for(ti: Any) -> bool:
    """Starts the whole-DAG shadow of ``ti``'s business run when it is due; True if started.

    Due: ``ti`` is a root task (no upstream) of a DAG shadowed whole (``shadowed_whole``)
    whose business run is fixed to ``shadow``. Never raises: the shadow must never disturb
    Airflow's run.
    """
    try:
        return _start(ti)
    except Exception as exc:  # never fatal to the primary
        log.warning("bridge: no whole-DAG shadow for %s: %s", getattr(ti, "dag_id", "?"), exc)
        return False


def fixed_route(dag: Any, business_date: str) -> str:
    """The shadow route of a business run fixed to ``shadow``: ``whole`` or ``task``, decided
    from the DAG file by the run's first shadowed task and the same for every later one."""
    from airflow_plugins.protection import config

    modes = mode_store(config.lease_store(), config.lease_dsn())
    route = WHOLE if shadowed_whole(dag) else "task"
    return modes.fix_route_for_business_run(dag.dag_id, business_date, route)


def _start(ti: Any) -> bool:
    task = ti.task
    dag = task.dag
    if task.upstream_task_ids:
        return False
    if any("BridgeOperator" in class_names(t) for t in dag.tasks):
        return False  # a driver DAG: its graph's mode is the one that counts (operator.py)
    from airflow_plugins.protection import config
    from airflow_plugins.protection.task_identity import target_from_context

    context = ti.get_template_context()
    business_date = target_from_context(context).business_date
    modes = mode_store(config.lease_store(), config.lease_dsn())
    if modes.get(dag.dag_id) is CutoverMode.AIRFLOW:
        return False  # the common case: nothing written (a run fixed to shadow is not primary)
    fixed_date = split_partition(business_date)[0]  # fixed per date, as the router fixes it
    if modes.fix_for_business_run(dag.dag_id, fixed_date) is not CutoverMode.SHADOW:
        return False
    if fixed_route(dag, fixed_date) != WHOLE:
        return False  # per-task shadows (a protected task's route fixed it so)
    translation = translate(dag, render=lambda value, _: task.render_template(value, context))
    if translation.spec is None:
        raise UntranslatableDag(translation)
    handoff.request(
        translation.spec,
        business_date,
        mode=RunMode.SHADOW,
        source=f"{SOURCE_PREFIX}{context['run_id']}",
        wait=False,
        partition=handoff.run_partition(context),
        run=handoff.airflow_run(context),
    )
    log.info("bridge: whole-DAG shadow of %s %s started", dag.dag_id, business_date)
    return True
