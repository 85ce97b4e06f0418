"""A message re-delivered while its try runs, on Airflow's own Celery settings.

The same road as ``test_celery.py``'s visibility-timeout scenario, on a stack of its own that
does not use the plugin's Celery settings (``airflow_plugins.protection.celery_config``): there
Airflow fails every running try whose message comes back, and the lease and the ledger are what
keeps the re-runs from charging anyone twice.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.billing_runs import (
    CUSTOMERS,
    PROTECTED,
    assert_exactly_once,
    finish,
    start_all,
    tally,
    tries,
)
from tests.e2e.celery_scenarios import report
from tests.harness.celery_harness import CeleryHarness, each_test, unguarded_celery_airflow

__all__ = ["unguarded_celery_airflow"]

pytestmark = [pytest.mark.celery]


@pytest.fixture
def unguarded(unguarded_celery_airflow: CeleryHarness) -> Iterator[CeleryHarness]:
    """The module's stack, both schedulers and both workers running around the test."""
    yield from each_test(unguarded_celery_airflow)


@pytest.mark.extended
@pytest.mark.timeout(1200)
def test_redelivered_copy_fails_the_running_try_without_the_celery_settings(
    unguarded: CeleryHarness,
) -> None:
    """Each try runs ~150 s, longer than the visibility timeout (30 s) plus kombu's restore
    period (it looks for expired unacknowledged messages every 10th tick of 10 s, so every
    100 s): Redis hands the message out again while the try runs.

    Airflow does not turn the copy away harmlessly. Its workload token lives
    ``[scheduler] task_queued_timeout`` (here 30 s, by default 600 s, against a default
    visibility timeout of a day), so the copy's start is refused with 403 "Invalid auth token",
    not with the 409 the Celery provider ignores (``TaskAlreadyRunningError``). The copy's
    Celery task ends FAILURE under the running try's Celery id; the scheduler takes that for the
    running try ("finished with state failed, but the task instance's state attribute is
    running") and queues a new try; the running try's next heartbeat gets 404 and its
    supervisor kills it. Each try is killed that way after ~100 s, and a new one starts from the
    top, until the retries run out.

    This stack runs without the plugin's Celery settings (``protection.celery_config``, which
    ignore the refused copy: ``test_celery.py`` runs the same road with them). What the lease
    and the ledger promise here is what this asserts: whatever Airflow ends the runs with, the
    protected variants charge no customer twice (the ledger skips what an earlier try charged,
    the lease keeps two tries apart), while plain Airflow's re-run charges again. It is
    ``extended`` (about 10 minutes): run it with
    ``.venv/bin/python -m pytest tests/e2e/test_celery_redelivery.py -m extended -s``.
    """
    runs = start_all(unguarded, 150 / CUSTOMERS)
    final = finish(unguarded, runs.values(), timeout=1000)
    report(unguarded, runs)
    logs = unguarded.worker_logs()
    refused = logs.count("ServerResponseError('Invalid auth token')")
    print(f"run states { ({v: r['state'] for v, r in final.items()}) }; copies refused {refused}")
    assert refused > 0, "no re-delivered copy was refused: the road was not taken"
    for variant, run in runs.items():
        got = tally(unguarded, run.business_date)
        print(f"{variant}: {tries(unguarded, run)} tries; {got.summary()}")
    for variant in PROTECTED:
        got = tally(unguarded, runs[variant].business_date)
        assert got.double_charged == 0, f"{variant}: {got.summary()}"
        if final[variant]["state"] == "success":
            assert_exactly_once(unguarded, runs[variant])
    plain = tally(unguarded, runs["unprotected"].business_date)
    assert tries(unguarded, runs["unprotected"]) >= 2, "Airflow did not re-run the plain try"
    assert plain.double_charged > 0, f"plain Airflow did not re-charge: {plain.summary()}"
