"""The shadow gate for a mode change made outside the command line (the plugin's page).

The gate reads the DAG's code (a ``DagBag`` of the DAG folder), which Airflow 3 never runs in its
api-server: ``check_in_child`` runs ``bridge mode check DAG`` in a child process
(``bridge.in_airflow.cli_child``), bounded by a timeout, and reads its one JSON line. The
answer is the command line's own, word for word.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

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


def set_scheduled_in_child(
    dag_id: str,
    mode: str,
    *,
    actor: str,
    reason: str,
    force: bool,
    lease_dsn: str,
    mode_now: Callable[[], str],
    timeout: float = TIMEOUT_S,
) -> tuple[str, str]:
    """A change into or out of ``temporal-scheduled`` made as ``bridge mode set`` makes it, in a
    child process: the Temporal Schedule created (the change undone if it cannot be) or
    deleted, the Airflow DAG paused or unpaused. The child uses the page's lease store
    (``lease_dsn``, passed in its environment).

    Returns:
        The mode before and after the change.

    Raises:
        ModeChangeRefused: the command line refused or failed (its one-line error, and the
            DAG's mode after it, read by ``mode_now``: a failed Schedule undoes the change, a
            failed delete does not), or did not answer within ``timeout``.
    """
    args = ["mode", "set", dag_id, mode, "--actor", actor, "--reason", reason]
    args += ["--dags-folder", dags_folder(), *(["--force"] if force else [])]
    try:
        done = run_bridge(args, timeout, {"BRIDGE_LEASE_DSN": lease_dsn})
    except subprocess.TimeoutExpired as exc:
        raise ModeChangeRefused(
            f"{dag_id}: `bridge mode set {mode}` did not answer within {timeout:.0f} s; check "
            f"`bridge mode get {dag_id}` and the Temporal schedule before trying again"
        ) from exc
    if done.code or done.answer is None:
        error = done.error or f"`bridge mode set` failed (exit {done.code})"
        raise ModeChangeRefused(f"{error} ({dag_id} is in mode {mode_now()})")
    return str(done.answer["previous"]), str(done.answer["current"])


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
            f"{dag_id}: the shadow gate failed (exit {done.code}; details in the log)"
        )
    if done.answer.get("shadow") != "allowed":
        raise ModeChangeRefused(str(done.answer.get("why") or f"{dag_id}: shadow refused"))
    note = done.answer.get("note")
    return str(note) if note else None
