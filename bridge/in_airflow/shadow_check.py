"""The shadow gate for a mode change made outside the command line (the plugin's page).

The gate reads the DAG's code (a ``DagBag`` of the DAG folder), which Airflow 3 never runs in its
api-server: ``check_in_child`` runs ``bridge mode check DAG`` in a child process
(``bridge.in_airflow.cli_child``), bounded by a timeout, and reads its one JSON line. The
answer is the command line's own, word for word.
"""

from __future__ import annotations

import subprocess

from bridge.cutover import ModeChangeRefused
from bridge.in_airflow.cli_child import run_bridge

TIMEOUT_S = 90.0


def dags_folder() -> str:
    """The DAG folder the gate reads: ``BRIDGE_DAGS_FOLDER`` / ``[bridge] dags_folder``, else
    Airflow's own ``[core] dags_folder`` (where the api-server's DAGs come from)."""
    from bridge.config import BridgeConfig

    folder = BridgeConfig.load().dags_folder
    if folder:
        return folder
    from airflow.configuration import conf

    return str(conf.get("core", "dags_folder"))


def check_in_child(dag_id: str, folder: str, timeout: float = TIMEOUT_S) -> str | None:
    """Runs the shadow gate of ``dag_id`` on ``folder`` in a child process.

    Returns:
        The gate's note (shadow allowed, but nothing hands the DAG over), or None.

    Raises:
        ModeChangeRefused: the gate refused (its message names the tasks), or it could not
            answer (timeout, crash): a change the gate cannot vouch for is refused.
    """
    try:
        done = run_bridge(["mode", "check", dag_id, "--dags-folder", folder], timeout)
    except subprocess.TimeoutExpired as exc:
        raise ModeChangeRefused(
            f"{dag_id}: the shadow gate did not answer within {timeout:.0f} s (parsing the DAG "
            "folder); try `bridge mode set` from a shell"
        ) from exc
    if done.answer is None:
        raise ModeChangeRefused(
            f"{dag_id}: the shadow gate failed ({done.error or f'exit {done.code}'}; details in "
            "the api-server's log)"
        )
    if done.answer.get("shadow") != "allowed":
        raise ModeChangeRefused(str(done.answer.get("why") or f"{dag_id}: shadow refused"))
    note = done.answer.get("note")
    return str(note) if note else None
