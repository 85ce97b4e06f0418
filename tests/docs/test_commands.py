"""Every shell command the docs tell a user to run, run as written.

The test reads the fenced ``bash``/``sh``/``shell``/``console`` blocks of README.md,
MIGRATION.md and docs/*.md and runs each block with bash (``set -euo pipefail``) from the
repository's root, the venv's ``bin`` first on PATH, in document order. Variables a block exports
are seen by the later blocks of the same file. A block fails the test when a command fails.

Marker convention (the first line of a block, a shell comment, so a reader sees it too):

    # docs-test: skip: <reason>      not run here (docker compose, the whole test suite, a bench
                                     of minutes, a network install); the reason is required and
                                     the skipped blocks are counted and printed
    # docs-test: serves: <reason>    a long-running server: started, must still be up after
                                     SERVE_SECONDS, then stopped
    # docs-test: exit N: <reason>    the documented outcome is exit code N (a gate refusing)

A block with ``runlease`` or ``bridge`` commands may not be skipped: every one of them runs.

The docs use fixed example addresses, which the test points at its own services:

    postgresql://<user>@leases-db/leases    the test's lease store (a fresh database)
    postgresql://<user>@billing-db/billing  the test's sink database
    temporal:7233                           a Temporal dev server started for this test
    /opt/airflow/dags                       the repository's dags/
    /run/runlease/                          a temporary directory

Write new examples with these addresses; a block with another placeholder (``...``, ``<x>``)
cannot run and must carry a skip marker. Re-run after editing docs:
``flock /tmp/eo-heavy.lock .venv/bin/python -m pytest tests/docs -s``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import create_database, drop_database

REPO = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    "MIGRATION.md",
    *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")),
)
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
SERVE_SECONDS = 4.0
BLOCK_TIMEOUT = 120.0
TEMPORAL_PORT = 27433  # not the bridge tests' 27233: both may run in one session

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"^#\s*docs-test:\s*(skip|serves|exit\s+(\d+))\s*(?::\s*(.*))?$")
COMMAND = re.compile(r"(^|[\s;&|(])(runlease|bridge|python -m bridge\.cli)\s", re.M)


@dataclasses.dataclass(frozen=True)
class Block:
    """One shell block of a doc, where it is and what its marker says."""

    doc: str
    line: int
    text: str
    mode: str  # run | skip | serves | exit
    expect: int
    reason: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks_of(doc: str) -> list[Block]:
    """The shell blocks of ``doc`` (a path relative to the repository), with their markers."""
    text = (REPO / doc).read_text()
    found = []
    for match in FENCE.finditer(text):
        if match.group(1) not in SHELL_LANGUAGES:
            continue
        body = match.group(2)
        line = text[: match.start()].count("\n") + 1
        first = body.lstrip().split("\n", 1)[0].strip()
        marker = MARKER.match(first)
        if marker is None:
            found.append(Block(doc, line, body, "run", 0, ""))
            continue
        kind = marker.group(1).split()[0]
        expect = int(marker.group(2)) if marker.group(2) else 0
        found.append(Block(doc, line, body, kind, expect, (marker.group(3) or "").strip()))
    return found


def all_blocks() -> list[Block]:
    """The shell blocks of every doc, in order."""
    return [b for doc in DOCS for b in blocks_of(doc)]


def _url(dsn: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    user = params.get("user", "postgres")
    host = params.get("host", "127.0.0.1")
    return f"postgresql://{user}@{host}:{params.get('port', 5432)}/{params['dbname']}"


@dataclasses.dataclass
class Services:
    lease_url: str
    sink_url: str
    temporal: str
    run_dir: Path

    def rewrite(self, text: str) -> str:
        text = re.sub(
            r"postgres(?:ql)?://[^\s'\"]*@leases-db[^\s'\"/]*/leases", self.lease_url, text
        )
        text = re.sub(
            r"postgres(?:ql)?://[^\s'\"]*@billing-db[^\s'\"/]*/billing", self.sink_url, text
        )
        text = text.replace("temporal:7233", self.temporal)
        text = text.replace("/opt/airflow/dags", str(REPO / "dags"))
        return text.replace("/run/runlease/", f"{self.run_dir}/")


def _temporal(folder: Path) -> Iterator[str]:
    from tests.bridge.conftest import dev_server

    port = TEMPORAL_PORT
    with dev_server(folder, port, http_port=port + 10, metrics_port=port + 20) as address:
        yield address


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    from airflow_plugins.lease import LEASE_STORE, SINK_FENCE, migrate

    lease, sink = create_database("eodocs"), create_database("eodocsink")
    try:
        migrate(lease, LEASE_STORE)
        migrate(sink, SINK_FENCE)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        for temporal in _temporal(tmp_path):
            yield Services(_url(lease), _url(sink), temporal, run_dir)
    finally:
        drop_database(lease)
        drop_database(sink)


def _environment(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EXACTLY_ONCE_", "BRIDGE_", "AIRFLOW", "PYTEST", "VIRTUAL_ENV"))
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    return env


def _script(block: Block, services: Services, env_file: Path, save: bool) -> str:
    body = services.rewrite(block.text)
    tail = f'\nexport -p > "{env_file}"\n' if save else "\n"
    return f'set -euo pipefail\nsource "{env_file}"\ncd "{REPO}"\n{body}{tail}'


def run_block(block: Block, services: Services, env_file: Path, home: Path) -> str | None:
    """Runs one block; returns why it failed, or None."""
    env = _environment(home)
    if block.mode == "serves":
        with subprocess.Popen(
            ["bash", "-c", _script(block, services, env_file, save=False)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        ) as proc:
            try:
                output, _ = proc.communicate(timeout=SERVE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)  # its own session: the block and children
                try:
                    proc.communicate(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
                return None  # it was still serving
        return f"exited {proc.returncode} instead of serving:\n{output[-3000:]}"
    done = subprocess.run(
        ["bash", "-c", _script(block, services, env_file, save=block.mode == "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    if done.returncode == block.expect:
        return None
    return (
        f"exit {done.returncode} (expected {block.expect}):\n"
        f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )


def test_markers_are_well_formed() -> None:
    """A skipped block says why, and no runlease/bridge command is skipped."""
    for block in all_blocks():
        if block.mode == "skip":
            assert block.reason, f"{block.where}: a skip marker needs its reason"
            assert not COMMAND.search(block.text), (
                f"{block.where}: runlease/bridge commands must run, not be skipped"
            )


def test_every_documented_command_runs(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = all_blocks()
    failures, ran = [], {"run": 0, "serves": 0, "exit": 0}
    for doc in DOCS:
        env_file = tmp_path / f"{Path(doc).stem}.env"
        env_file.write_text("")
        home = tmp_path / f"{Path(doc).stem}-airflow"
        home.mkdir()
        for block in (b for b in blocks if b.doc == doc):
            if block.mode == "skip":
                continue
            ran[block.mode] += 1
            if (why := run_block(block, services, env_file, home)) is not None:
                failures.append(f"{block.where}: {why}")
    skipped = [b for b in blocks if b.mode == "skip"]
    with capsys.disabled():
        print(
            f"\ndocs commands: {len(blocks)} shell blocks; ran {ran['run']}, "
            f"{ran['serves']} servers, {ran['exit']} expected refusals; skipped {len(skipped)}:"
        )
        for block in skipped:
            print(f"  {block.where}: {block.reason}")
    assert not failures, "\n\n".join(failures)
    commands = sum(len(COMMAND.findall(b.text)) for b in blocks if b.mode != "skip")
    assert commands > 0
