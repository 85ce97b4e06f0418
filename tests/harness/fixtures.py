"""Pytest fixtures of the real-Airflow harness. Import them into a conftest or test module::

from tests.harness.fixtures import airflow  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ADMIN_DSN
from tests.harness.airflow_harness import AirflowHarness

# Every module that imports ``airflow`` gets its own session-scoped fixture definition from
# pytest; they share this one stack, stopped when the last of them is finalised.
_shared: AirflowHarness | None = None
_users = 0


@pytest.fixture(scope="session")
def airflow() -> Iterator[AirflowHarness]:
    """One running Airflow 3.3 stack for the whole session (see ``AirflowHarness``)."""
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
            _shared.stop()
            _shared = None


@pytest.fixture
def business_date(airflow: AirflowHarness) -> str:
    """A business date no other test of the session uses."""
    return airflow.fresh_business_date()
