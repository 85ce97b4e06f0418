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
from collections.abc import Mapping
from typing import Any

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
    if done.returncode and not errors:
        log.error("bridge %s failed (exit %s): %s", args[:3], done.returncode, stderr)
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
    return ChildAnswer(done.returncode, answer, error)
