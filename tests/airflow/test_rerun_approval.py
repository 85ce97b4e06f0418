"""A re-run asked for in the run conf is honoured only when an administrator approved it where
the permission can be checked (the pages' approve action, which needs Op/Admin, or the CLI):
the conf of a run anyone with the User role may trigger approves nothing by itself."""

from __future__ import annotations

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_plugins.lease import LeaseStore
from tests.airflow.conftest import task_context
from tests.airflow.test_operator import KEY, NIGHT, Billing, _operator

RERUN = {"business_date": "2024-02-15", "exactly_once_rerun": {"reason": "INC-42 refund fix"}}


def _events(lease: str) -> list[tuple[str, str, str | None]]:
    with LeaseStore(lease) as store:
        return [(h["event"], h["outcome"], h["actor"]) for h in store.history(KEY)]


def test_a_conf_rerun_without_a_recorded_approval_is_refused_and_audited(
    plugin_env: dict[str, str],
) -> None:
    body = Billing()
    op = _operator(body)
    op.execute(task_context(op, logical_date=NIGHT))
    with psycopg.connect(plugin_env["sink"], autocommit=True) as conn:
        conn.execute("DELETE FROM runfence.ledger")  # so a re-run would charge again
    context = task_context(op, run_id="manual__rerun", conf=RERUN, triggering_user="mallory")
    with pytest.raises(AirflowFailException, match="not approved"):
        op.execute(context)
    assert body.calls == 1
    with psycopg.connect(plugin_env["sink"]) as conn:
        assert conn.execute("SELECT count(*) FROM charges").fetchone() == (5,)
    events = _events(plugin_env["lease"])
    assert ("rerun_request", "refused", "mallory") in events
    assert not any(e[0] == "approve_rerun" for e in events)

    # approved by an administrator (the page's approve action runs exactly this, after its
    # permission check): the same conf now re-runs, once
    with LeaseStore(plugin_env["lease"]) as store:
        assert store.approve_rerun(KEY, actor="admin", reason="INC-42 approved") == "approved"
    assert op.execute(context) == {"charged": 5}
    assert body.calls == 2
    again = task_context(
        op, run_id="manual__rerun", conf=RERUN, triggering_user="mallory", try_number=2
    )
    assert op.execute(again) == {"charged": 5}
    assert body.calls == 2
