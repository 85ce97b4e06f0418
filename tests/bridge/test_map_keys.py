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
