"""A whole-DAG shadow's comparison when Airflow's REST API refuses the worker or is not there.

Refused credentials (401/403) cannot get better by waiting: the comparison stops at once and
its row says why (the user's name, never the password). An unreachable API may come back: the
comparison stays pending, but its verdict and the worker's log say why it waits. The API is a
real HTTP server on localhost answering as Airflow's api-server does to a wrong password.
"""

from __future__ import annotations

import http.server
import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from airflow_plugins.lease import LeaseStore
from bridge.airflow_side import SOURCE_PREFIX
from bridge.comparison import CompareInput, compare_run, get_comparison, readiness, waits
from bridge.config import SETTINGS, BridgeConfig
from bridge.spec import DagRunResult, DagSpec, RunMode, TaskOutcome, TaskSpec

PASSWORD = "s3cret-never-shown"
DAY = "2024-03-01"


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b'{"detail":"Invalid credentials"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _input(final: bool = False) -> CompareInput:
    spec = DagSpec(dag_id="ordinary", tasks=(TaskSpec(task_id="extract", callable_ref="m:f"),))
    shadow = DagRunResult(
        "ordinary", DAY, RunMode.SHADOW, "success", {"extract": TaskOutcome("succeeded", 1)}
    )
    return CompareInput(spec, shadow, final, f"{SOURCE_PREFIX}manual__{DAY}")


def _api_env(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("BRIDGE_AIRFLOW_API_URL", url)
    monkeypatch.setenv("BRIDGE_AIRFLOW_API_USER", "reader")
    monkeypatch.setenv("BRIDGE_AIRFLOW_API_PASSWORD", PASSWORD)


def test_refused_credentials_stop_the_comparison_at_once_and_the_row_says_why(
    lease_store: LeaseStore,
    refusing_api: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _api_env(monkeypatch, refusing_api)
    with caplog.at_level(logging.WARNING):
        verdict = compare_run(lease_store, _input(final=False))
    assert verdict.pending is False  # not polled for a day
    assert verdict.matched is False
    row = get_comparison(lease_store, "ordinary", DAY)
    assert row is not None
    assert row["primary_status"] == "refused"
    [why] = row["differences"]
    assert why["what"] == "airflow_api"
    assert "refused user 'reader' (401)" in why["reason"]
    assert "BRIDGE_AIRFLOW_API_PASSWORD" in why["reason"]
    assert PASSWORD not in str(row)
    assert PASSWORD not in caplog.text
    assert "refused user 'reader'" in caplog.text


def test_an_unreachable_api_keeps_the_comparison_waiting_and_says_why(
    lease_store: LeaseStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    _api_env(monkeypatch, url)
    with caplog.at_level(logging.WARNING):
        verdict = compare_run(lease_store, _input(final=False))
    assert verdict.pending is True
    [why] = verdict.differences
    assert why["what"] == "airflow_api"
    assert url in why["reason"]
    assert f"waits for Airflow's API: Airflow's API at {url}" in caplog.text
    assert get_comparison(lease_store, "ordinary", DAY) is None
    assert PASSWORD not in caplog.text
    # what the Migration page, `bridge compare` and the cutover refusal show meanwhile
    [wait] = waits(lease_store, "ordinary")
    assert (wait["business_date"], wait["reason"]) == (DAY, why["reason"])
    assert PASSWORD not in str(wait)
    gate = readiness(lease_store, "ordinary", 3).why_not()
    assert gate.startswith("no shadow run has been compared yet; run 3 in shadow first; ")
    assert gate.endswith(f"the comparison of {DAY} is pending: {why['reason']}")

    # the wait's end: the row is stored, saying Airflow's side was never read and why
    verdict = compare_run(lease_store, _input(final=True))
    assert verdict.pending is False
    row = get_comparison(lease_store, "ordinary", DAY)
    assert row is not None
    assert row["primary_status"] == "missing"
    assert row["differences"][0]["what"] == "airflow_api"
    assert url in row["differences"][0]["reason"]
    assert waits(lease_store, "ordinary") == []


def test_the_api_settings_are_the_bridges_and_the_password_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _api_env(monkeypatch, "http://airflow-api:8080")
    config = BridgeConfig.load()
    assert config.airflow_api_url == "http://airflow-api:8080"
    assert config.airflow_api_user == "reader"
    assert config.airflow_api_password == PASSWORD
    assert PASSWORD not in repr(config)
    [declared] = [s for s in SETTINGS if s.env == "BRIDGE_AIRFLOW_API_PASSWORD"]
    assert declared.sensitive is True


def test_a_password_written_into_the_api_url_is_not_in_the_row_or_the_log(
    lease_store: LeaseStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://reader:{PASSWORD}@127.0.0.1:{_closed_port()}"
    _api_env(monkeypatch, url)
    with caplog.at_level(logging.WARNING):
        compare_run(lease_store, _input(final=True))
    row = get_comparison(lease_store, "ordinary", DAY)
    assert row is not None
    assert row["differences"][0]["what"] == "airflow_api"
    assert "127.0.0.1" in row["differences"][0]["reason"]
    assert PASSWORD not in str(row)
    assert PASSWORD not in caplog.text
