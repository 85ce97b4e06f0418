"""The bridge's command line run in a child process, for the plugin's pages.

Airflow 3 never runs DAG code in its api-server, and a process that loads temporalio can abort at
exit: what reads the DAG folder or talks to Temporal for a page (the shadow gate, a change into or
out of ``temporal-scheduled``) runs ``python -m bridge.cli --json ...`` in a child, bounded by a
timeout, and the page gives the command line's own answer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from airflow_plugins.lease.command_line import EXIT_UNREACHABLE
from bridge.cutover import ModeChangeRefused

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ChildAnswer:
    """What the child said: its exit code, its last JSON line (None: none), its error line."""

    code: int
    answer: dict[str, Any] | None
    error: str


def run_bridge(
    args: list[str], timeout: float, env: Mapping[str, str] | None = None
) -> ChildAnswer:
    """Runs ``bridge --json ARGS`` in a child process with the api-server's environment (and
    ``env`` over it: settings passed in the environment, never on its command line).

    ``error`` is the command line's one-line error (``bridge: error: ...``) when it printed
    one, else empty: the rest of its stderr may quote DAG code or settings, so it goes to the
    log, never to the page.

    Raises:
        subprocess.TimeoutExpired: the child did not finish within ``timeout`` seconds.
    """
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "--json", *args],
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    stderr = done.stderr.decode(errors="replace")
    errors = [line for line in stderr.splitlines() if line.startswith("bridge: error: ")]
    if done.returncode:
        log.error("bridge %s failed (exit %s): %s", args[:2], done.returncode, stderr)
    answer = None
    for line in reversed(done.stdout.decode(errors="replace").strip().splitlines()):
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(parsed, dict):
            answer = parsed
            break
    error = errors[-1].removeprefix("bridge: error: ") if errors else ""
    if done.returncode == EXIT_UNREACHABLE:  # its message names hosts, ports and users
        error = "Temporal or the lease store did not answer (details in the api-server's log)"
    return ChildAnswer(done.returncode, answer, error)


def set_mode_in_child(
    dag_id: str,
    mode: str,
    *,
    actor: str,
    reason: str,
    force: bool,
    folder: str,
    lease_dsn: str,
    mode_now: Callable[[], str],
    timeout: float = 90.0,
) -> tuple[str, str, str]:
    """``bridge mode set`` in a child process, for a change into or out of
    ``temporal-scheduled``: the Temporal Schedule made before the mode changes (or deleted
    after), the Airflow DAG paused or unpaused, as the command line does it. The child uses the
    page's lease store (``lease_dsn``, passed in its environment, never on its command line).

    Returns:
        The mode before and after, and a warning for the user ("" when none): a Schedule a
        rollback could not delete.

    Raises:
        ModeChangeRefused: the command line refused or failed (its one-line error, and the
            DAG's mode after it, read by ``mode_now``), or did not answer within ``timeout``.
    """
    if dag_id.startswith("-"):  # the command line would read it as an option
        raise ModeChangeRefused(f"{dag_id!r}: change its mode with `bridge mode set` in a shell")
    args = ["mode", "set", dag_id, mode, f"--actor={actor}", f"--reason={reason}"]
    args += [f"--dags-folder={folder}", *(["--force"] if force else [])]
    try:
        done = run_bridge(args, timeout, {"BRIDGE_LEASE_DSN": lease_dsn})
    except subprocess.TimeoutExpired as exc:
        raise ModeChangeRefused(
            f"{dag_id}: `bridge mode set {mode}` did not answer within {timeout:.0f} s ({dag_id} "
            f"is in mode {mode_now()}); check the Temporal schedule before trying again"
        ) from exc
    if done.code or done.answer is None:
        error = done.error or f"`bridge mode set` failed (exit {done.code})"
        raise ModeChangeRefused(f"{error} ({dag_id} is in mode {mode_now()})")
    left = done.answer.get("schedule_left")
    warning = (
        f"the Temporal schedule {left} could not be deleted (its ticks start nothing now); "
        "delete it when Temporal is back: temporal schedule delete --schedule-id " + str(left)
        if left
        else ""
    )
    return str(done.answer["previous"]), str(done.answer["current"]), warning
