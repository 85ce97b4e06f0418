"""The protocol model, checked by spin: the real protocol has no violation, broken ones do.

The model (airflow_plugins/lease/model/runlease.pml) is explored exhaustively for 3 holders
and a bounded number of faults. A mutation test breaks one guard in a copy of the model and
asserts that spin finds the counterexample (printed with ``-s``). The hash test fails when a
SQL statement the model mirrors changed without the model being looked at.
"""

from __future__ import annotations

import pytest

from tests.model import sql_hashes
from tests.model.spin_check import verify

# the guard of queries.sql:fence_advance (WHERE f.token <= excluded.token)
FENCE_GUARD = ":: fence <= tok[h] -> fence_lock = h "
# the keeper's deadline counts from the renew's sending, so it passes before the server expiry
KEEPER_GUARD = "#define KEEPER !TRUSTED"


def test_sql_the_model_mirrors_is_unchanged() -> None:
    problems = sql_hashes.stale()
    assert sql_hashes.markers(), "the model names no SQL statement"
    assert not problems, "\n".join(
        [*problems, "review the model, then: .venv/bin/python -m tests.model.sql_hashes --update"]
    )


@pytest.mark.timeout(300)
def test_no_violation_with_three_holders_and_two_faults() -> None:
    verdict = verify(faults=2)
    print(verdict.summary())
    assert verdict.complete, verdict.output
    assert verdict.errors == 0, verdict.summary()
    assert verdict.states > 1_000_000  # the search went through the faulted interleavings


@pytest.mark.timeout(300)
def test_every_key_completes_once_faults_stop() -> None:
    verdict = verify(faults=1, liveness=True)
    print(verdict.summary())
    assert verdict.complete, verdict.output
    assert verdict.errors == 0, verdict.summary()


@pytest.mark.timeout(120)
def test_spin_finds_the_stale_write_without_the_fence_guard() -> None:
    verdict = verify(faults=1, replace=[(FENCE_GUARD, ":: true -> fence_lock = h ")])
    print(verdict.summary())
    assert verdict.errors >= 1
    assert "tok[h]>=maxf" in verdict.failed.replace(" ", "")
    assert verdict.trail


@pytest.mark.timeout(120)
def test_spin_finds_the_keeper_trusting_a_deadline_past_the_expiry() -> None:
    verdict = verify(faults=1, replace=[(KEEPER_GUARD, "#define KEEPER true")])
    print(verdict.summary())
    assert verdict.errors >= 1
    assert "ldl" in verdict.failed
    assert verdict.trail


def test_a_changed_statement_is_caught_and_a_comment_edit_is_not() -> None:
    guard = sql_hashes.statement("queries", "fence_advance")
    recorded = sql_hashes.digest(guard)
    assert sql_hashes.digest("-- why it is so\n" + guard.replace(" ", "  ")) == recorded
    assert sql_hashes.digest(guard.replace("f.token <= excluded.token", "true")) != recorded
