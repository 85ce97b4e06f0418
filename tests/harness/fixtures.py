"""Pytest fixtures of the real-Airflow harness. Import them into a conftest or test module::

from tests.harness.fixtures import airflow  # noqa: F401
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ADMIN_DSN
from tests.harness.airflow_harness import AirflowHarness

# Where the stack's AIRFLOW_HOME (component and task logs) is kept when a test failed
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "airflow"
TAIL_LINES = 60

# Every module that imports ``airflow`` gets its own session-scoped fixture definition from
# pytest; they share this one stack, stopped when the last of them is finalised.
_shared: AirflowHarness | None = None
_users = 0


@pytest.fixture(scope="session")
def airflow(request: pytest.FixtureRequest) -> Iterator[AirflowHarness]:
    """One running Airflow 3.3 stack for the whole session (see ``AirflowHarness``).

    When any test of the session failed, the stack's AIRFLOW_HOME (every component's log and
    every task's log) is copied to ``test-artifacts/airflow/<time>/`` before the stack is
    stopped, and the end of each component's log goes to stderr, so a failure seen only in a
    CI log can still be explained.
    """
    global _shared, _users
    if _shared is None:
        harness = AirflowHarness(ADMIN_DSN)
        try:
            harness.start()
        except BaseException:
            harness.stop()
            raise
        _shared = harness
    _users += 1
    try:
        yield _shared
    finally:
        _users -= 1
        if _users == 0:
            if request.session.testsfailed:
                keep_logs(_shared.stack.home)
            _shared.stop()
            _shared = None


def keep_logs(home: Path, into: Path = ARTIFACTS) -> Path:
    """Copies a stack's AIRFLOW_HOME (without its config and passwords) to a new folder in
    ``into`` and prints the end of each component's log; returns the folder."""
    kept = into / time.strftime("%Y%m%dT%H%M%S")
    shutil.copytree(
        home, kept, ignore=shutil.ignore_patterns("*.pid", "*passwords*", "airflow.cfg")
    )
    out = sys.__stderr__ or sys.stderr
    print(f"\n[airflow harness] a test failed: the stack's logs are kept in {kept}", file=out)
    for log in sorted(kept.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        print(f"\n----- last {len(lines)} lines of {log.name} -----", file=out)
        print("\n".join(lines), file=out)
    return kept


@pytest.fixture
def business_date(airflow: AirflowHarness) -> str:
    """A business date no other test of the session uses."""
    return airflow.fresh_business_date()
