"""The handover page's Temporal read when Temporal is down: a clear answer, never a 500.

``read_views`` runs ``bridge tasks --json`` in a child process (the api-server never loads the
Temporal client); with nothing listening at the configured address the page data says Temporal
is unreachable, without the address or the client's error text (those go to the log).
"""

from __future__ import annotations

import pytest

from airflow_plugins.views.handover import read_views


def test_temporal_down_gives_a_clear_answer_without_its_details(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BRIDGE_TEMPORAL_ADDR", "127.0.0.1:9")
    page = read_views(["dagrun:billing_nightly/dagrun/2026-11-01"], timeout=60)
    assert page.views == {}
    assert page.unavailable == "Temporal is unreachable (exit 3; details in the log)"
    assert read_views([]).unavailable is None  # nothing handed over: no read at all
