"""The mixed comparison's effect check (``bridge.comparison._effect_differences``) on its own:
what a fenced task wrote (ledger items) and what it charged or would have charged (external
calls) on each side. A call is the item, its idempotency key and its request; the primary's
processor answer (state, reference) is not part of it, since a shadow never gets one."""

from __future__ import annotations

from typing import Any

from bridge.comparison import _effect_differences, _Side


def _side(items: dict[str, list[str]], calls: dict[str, list[dict[str, Any]]]) -> _Side:
    return _Side(status="success", ms=None, digests={}, items=items, calls=calls)


def _call(item: str, amount: int, **answer: str) -> dict[str, Any]:
    params = {"amount": amount, "currency": "usd", "customer": item}
    key = f"billing/charge/2024-02-15/{item}"
    return {"item": item, "idempotency_key": key, "params": params, **answer}


def test_the_same_effects_in_any_order_match_whatever_the_processor_answered() -> None:
    primary = _side(
        {"charge": ["c1", "c2"]},
        {"charge": [_call("c1", 100, state="succeeded", reference="ch_1"), _call("c2", 200)]},
    )
    shadow = _side({"charge": ["c2", "c1"]}, {"charge": [_call("c2", 200), _call("c1", 100)]})
    assert _effect_differences(primary, shadow) == []


def test_items_and_calls_only_one_side_has_are_named_by_task_and_side() -> None:
    primary = _side(
        {"charge": ["c1", "c2"], "refund": ["r1"]},
        {"charge": [_call("c1", 100), _call("c2", 200)]},
    )
    shadow = _side({"charge": ["c1", "c3"]}, {"charge": [_call("c1", 100), _call("c3", 300)]})
    assert _effect_differences(primary, shadow) == [
        {"what": "sink_items", "task": "charge", "only_primary": ["c2"], "only_shadow": ["c3"]},
        {"what": "sink_items", "task": "refund", "only_primary": ["r1"], "only_shadow": []},
        {"what": "external_calls", "task": "charge", "only_primary": ["c2"], "only_shadow": ["c3"]},
    ]


def test_a_call_for_another_amount_is_a_difference_though_its_item_was_written() -> None:
    primary = _side({"charge": ["c1"]}, {"charge": [_call("c1", 100)]})
    shadow = _side({"charge": ["c1"]}, {"charge": [_call("c1", 150)]})
    assert _effect_differences(primary, shadow) == [
        {"what": "external_calls", "task": "charge", "only_primary": ["c1"], "only_shadow": ["c1"]},
    ]


def test_a_task_that_called_nothing_on_one_side_is_a_difference() -> None:
    primary = _side({"charge": ["c1"]}, {"charge": [_call("c1", 100)]})
    shadow = _side({"charge": ["c1"]}, {})
    assert _effect_differences(primary, shadow) == [
        {"what": "external_calls", "task": "charge", "only_primary": ["c1"], "only_shadow": []},
    ]
