"""A lease agent (``runlease agent``) as a process of its own, for tests that kill or stop it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_plugins.lease.agent_client import AgentClient
from tests.conftest import store_backends
from tests.lease.waiting import wait_for

RUNLEASE = Path(sys.executable).with_name("runlease")


def agent_backends(dsn: str) -> list[int]:
    """The server processes of the agent's connections on ``dsn``'s database."""
    return store_backends(dsn, "runlease-agent")


class AgentProcess:
    """``runlease agent`` as a process of its own, stopped by its pid."""

    def __init__(self, dsn: str, path: Path, *extra: str) -> None:
        self.path = path
        self.log = path.with_suffix(".log")
        with self.log.open("wb") as log:  # the agent keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [str(RUNLEASE), "--dsn", dsn, "agent", "--socket", str(path), *extra],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        probe = AgentClient(str(path), dsn, timeout=10)
        wait_for(lambda: self.proc.poll() is not None or probe.ping(), timeout=30)
        assert self.proc.poll() is None, self.log.read_text()

    def signal(self, signum: int) -> None:
        """Sends ``signum`` to the agent."""
        os.kill(self.proc.pid, signum)

    def stop(self) -> None:
        """Kills the agent if it still runs, and reaps it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
