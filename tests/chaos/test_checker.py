"""The checker's verdict on hand-made histories: each violation it must report, it reports."""

from __future__ import annotations

from typing import Any

from tests.chaos.checker import check

KEY = "chaos_billing/charge/2026-12-01/run-00000"


def _log(probe: str = "succeeded") -> dict[str, Any]:
    return {
        "mode": "fenced",
        "seed": 0,
        "keys": {KEY: ["item-000", "item-001", "item-002"]},
        "faults": [{"kind": "sigkill", "key": KEY, "t": 10.0, "landed": True}],
        "probe": {KEY: probe},
    }


def test_a_clean_history_has_no_violation() -> None:
    rows = [
        (1, KEY, "item-000", 5, 9.0),
        (2, KEY, "item-001", 7, 11.0),
        (3, KEY, "item-002", 7, 12.0),
    ]
    verdict = check(rows, _log())
    assert verdict["duplicate_effects"] == verdict["stale_writes_accepted"] == 0
    assert verdict["items_missed"] == verdict["keys_wedged"] == 0
    assert verdict["by_fault"]["sigkill"]["recover_p50_s"] == 1.0


def test_a_fault_that_hit_no_run_is_counted_for_no_run() -> None:
    """A campaign may inject a fault (a scheduler or agent kill) while no run is at work: the
    seed-4 Celery campaign did, and the checker raised ``KeyError`` instead of judging."""
    log = _log()
    log["faults"].append({"kind": "agent_sigkill", "key": "", "t": 12.0, "landed": False})
    rows = [
        (1, KEY, "item-000", 5, 9.0),
        (2, KEY, "item-001", 5, 9.5),
        (3, KEY, "item-002", 5, 13.0),
    ]
    verdict = check(rows, log)
    assert verdict["by_fault"]["agent_sigkill"] == {
        **verdict["by_fault"]["agent_sigkill"],
        "injected": 1,
        "landed": 0,
        "runs": 0,
        "items": 0,
    }
    assert verdict["duplicate_effects"] == verdict["items_missed"] == 0
    assert verdict["faults_injected"] == 2
    assert verdict["faults_unattributed"] == 1


def test_duplicates_stale_writes_missed_items_and_wedged_keys_are_reported() -> None:
    rows = [(1, KEY, "item-000", 7, 9.0), (2, KEY, "item-000", 5, 11.0)]  # again, older token
    verdict = check(rows, _log(probe="held"))
    assert verdict["duplicate_effects"] == 1
    assert verdict["stale_writes_accepted"] == 1
    assert verdict["items_missed"] == 2
    assert verdict["keys_wedged"] == 1
    assert verdict["by_fault"]["sigkill"]["keys_wedged"] == 1


def test_items_charged_twice_or_never_at_the_processor_are_reported() -> None:
    log = {
        **_log(),
        "processors": {"idempotent": "http://unused"},
        "processor_keys": {KEY: "idempotent"},
    }
    rows = [(1, KEY, "item-000", 5, 9.0), (2, KEY, "item-001", 5, 11.0)]
    charge = {"customer": "item-000", "metadata": {"customer": "item-000", "run": KEY}}
    other = {"customer": "item-001", "metadata": {"customer": "item-001", "run": "another"}}
    verdict = check(rows, log, {"idempotent": [charge, dict(charge), other]})
    assert verdict["processor_duplicates"] == 1
    assert verdict["processor_items_missed"] == 2  # item-001's charge was another run's
    assert verdict["by_fault"]["sigkill"]["processor_duplicates"] == 1
    assert verdict["processor_charges"] == 3


def test_the_bridge_checker_reports_a_leaked_shadow_write_and_a_shadow_not_completed() -> None:
    """A shadow's writes are rolled back: a row its run wrote, found in the sink, is a leak (it
    may not be a duplicate: here the primary never wrote that customer)."""
    from tests.chaos.bridge_checker import bad, judge

    log = {**_log(), "runs": ["primary-wf"], "shadows": ["shadow-wf"]}
    rows = [
        (1, KEY, "item-000", 5, 9.0, "primary:11"),
        (2, KEY, "item-001", 5, 11.0, "primary:11"),
        (3, KEY, "item-002", 3, 12.0, "shadow:12"),
    ]
    temporal = {
        "states": {"primary-wf": "COMPLETED", "shadow-wf": "FAILED"},
        "executions": {"primary-wf": 1, "shadow-wf": 1},
    }
    verdict = judge(rows, 3, log, temporal)
    assert verdict["shadow_rows_leaked"] == 1
    assert verdict["shadows_not_completed"] == 1
    assert verdict["workflows_not_completed"] == 0
    assert bad(verdict) >= 2
    clean = judge([(*r[:5], "primary:11") for r in rows], 3, log, temporal)
    assert clean["shadow_rows_leaked"] == 0


def test_a_mapped_charge_is_judged_per_tenant_with_its_own_tokens() -> None:
    """Each tenant's charge of a business date holds a lease of its own: its tokens interleave
    with the other tenant's. Judged per date, the first mapped campaign's clean rows read as
    stale writes; judged per tenant (``by_run``), a tenant's own duplicate still shows."""
    from tests.chaos.airflow_checker import judge

    day = "2026-11-23"
    keys = {f"{day}/north": ["cust-0001", "cust-0003"], f"{day}/south": ["cust-0002"]}
    log = {
        "mode": "fenced",
        "seed": 0,
        "keys": keys,
        "runs": [["chaos__1", day, False]],
        "faults": [{"kind": "clear", "key": f"{day}/south", "t": 10.0, "landed": True}],
        "probe": dict.fromkeys(keys, "granted"),
    }
    rows = [
        (1, day, "cust-0002", 9, 9.0),  # south, token 9
        (2, day, "cust-0001", 4, 9.5),  # north's own token 4: not stale
        (3, day, "cust-0003", 4, 11.0),
    ]
    charges = [{"metadata": {"run": day}, "customer": c} for c in ("cust-0001", "cust-0002")]
    states = {"chaos__1": {"run": "success", "task": "success", "tries": "3"}}
    verdict = judge(rows, log, charges, states)
    assert verdict["stale_writes_accepted"] == verdict["duplicate_effects"] == 0
    assert verdict["items_missed"] == 0
    assert verdict["processor_items_missed"] == 1  # cust-0003 has no charge at the processor
    again = judge([*rows, (4, day, "cust-0002", 9, 12.0)], log, charges, states)
    assert again["duplicate_effects"] == 1
    assert again["by_fault"]["clear"]["duplicate_effects"] == 1
