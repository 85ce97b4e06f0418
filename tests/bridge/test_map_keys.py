"""The bridge's mapped items: keyed by the one escaping of ``keys``; a collision names both."""

from __future__ import annotations

import pytest

from airflow_plugins.lease import InvalidLeaseInput


def test_two_mapped_items_with_one_key_fail_naming_both() -> None:
    from airflow_plugins.lease.keys import escape_map_key
    from bridge.identity import map_items

    values = [{"tenant": "acme"}, {"tenant": "initech"}, {"tenant": "acme"}]
    with pytest.raises(InvalidLeaseInput) as failed:
        map_items(values, "tenant")
    message = str(failed.value)
    assert "item 0" in message
    assert "item 2" in message
    assert "'acme'" in message
    assert [k for k, _ in map_items(values[:2], "tenant")] == ["acme", "initech"]
    assert escape_map_key("acme/eu") != escape_map_key("acme_eu")


def test_expanded_items_are_the_cross_product_in_airflows_order_keyed_by_their_arguments() -> None:
    from bridge.identity import expand_key, expanded_items

    items = expanded_items({"letter": ["b", "a"], "number": [2, 1]})
    # map index order as Airflow's: the last argument varies fastest
    assert [v for _, v in items] == [
        {"letter": "b", "number": 2},
        {"letter": "b", "number": 1},
        {"letter": "a", "number": 2},
        {"letter": "a", "number": 1},
    ]
    keys = [k for k, _ in items]
    assert len(set(keys)) == 4
    assert all(k.startswith("args-") for k in keys)
    # by identity, not position: the same arguments key alike in a reordered list
    again = dict(
        (tuple(sorted(v.items())), k)
        for k, v in expanded_items({"letter": ["a", "b"], "number": [1, 2]})
    )
    assert all(again[tuple(sorted(v.items()))] == k for k, v in items)
    # one string or integer argument keys as an upstream list's item does: the item itself
    assert [k for k, _ in expanded_items({"x": ["acme", 7]})] == ["acme", "7"]
    assert expand_key({"x": {"a": 1}}).startswith("args-")


def test_two_expanded_items_with_the_same_arguments_fail_naming_both() -> None:
    from bridge.identity import expanded_items

    with pytest.raises(InvalidLeaseInput) as failed:
        expanded_items({"letter": ["a", "b", "a"], "number": [1]})
    message = str(failed.value)
    assert "item 0" in message
    assert "item 2" in message
    assert "same arguments" in message
