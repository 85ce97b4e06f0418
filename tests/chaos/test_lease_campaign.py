"""The CI slice of the lease-level campaign: a fixed seed, real processes, real Postgres.

With the plugin (the store's Postgres restarted under it too), the independent checker finds
no duplicate, no stale write, no missed item and no wedged key; with the plugin disabled
(holders writing without lease and fence) the same checker finds the duplicates, so it is
shown to catch them.
"""

from __future__ import annotations

import pytest

from tests.chaos.lease_campaign import campaign

SEED = 1


@pytest.mark.timeout(240)
def test_fenced_holders_under_faults_write_every_item_once() -> None:
    # on a private Postgres of its own, restarted or crashed twice among the faults
    verdict = campaign(SEED, 150, plain=False, private_pg=2)
    assert verdict["faults_injected"] == 150
    assert verdict["faults_landed"] > 0
    assert verdict["items"] > 0
    assert verdict["duplicate_effects"] == 0
    assert verdict["stale_writes_accepted"] == 0
    assert verdict["items_missed"] == 0
    assert verdict["keys_wedged"] == 0


@pytest.mark.timeout(180)
def test_the_checker_finds_duplicates_with_the_plugin_disabled() -> None:
    verdict = campaign(SEED, 40, plain=True)
    assert verdict["faults_landed"] > 0
    assert verdict["duplicate_effects"] > 0
