"""The guide's durable operator, ``docs/examples/durable_operator.py``, against a job service.

The job service is a stand-in HTTP server in this test (the boundary): ``POST /jobs`` accepts a
job (a known ``Idempotency-Key`` gets its job back), ``GET /jobs/<id>`` gives its status,
``GET /jobs?idempotency_key=`` finds a job by key. The example's DAG is loaded from the file and
its task wrapped by the policy (the DAG is tagged), then run as the other operator tests run
operators: the first DAG run's try dies after its job was submitted, a second DAG run of the
date re-attaches to that job; without the plugin it submits a second one.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException

from airflow_plugins.protection import policy
from tests.airflow.conftest import free_port, task_context

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "durable_operator.py"
GUIDE = ROOT / "docs" / "airflow_plugin.md"
NIGHT = datetime(2024, 2, 15, 3, tzinfo=UTC)


class JobService:
    """The stand-in job service's state."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []
        self.failing_status_reads = 0
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                payload = json.loads(self.rfile.read(length) or b"null")
                key = self.headers.get("Idempotency-Key")
                with service.lock:
                    known = [j for j in service.jobs if key and j["key"] == key]
                    if not known:
                        job = {"id": f"run-{len(service.jobs) + 1}", "key": key}
                        service.jobs.append({**job, "status": "RUNNING", "payload": payload})
                        known = [service.jobs[-1]]
                self._answer(200, {"id": known[0]["id"]})

            def do_GET(self) -> None:
                url = urlparse(self.path)
                with service.lock:
                    if url.path == "/jobs":
                        key = parse_qs(url.query).get("idempotency_key", [""])[0]
                        found = [{"id": j["id"]} for j in service.jobs if j["key"] == key]
                        self._answer(200, found)
                        return
                    if service.failing_status_reads:
                        service.failing_status_reads -= 1
                        self._answer(503, {"error": "unavailable"})
                        return
                    job = next(j for j in service.jobs if url.path == f"/jobs/{j['id']}")
                    self._answer(200, {"id": job["id"], "status": job["status"]})

        return Handler

    def finish(self) -> None:
        with self.lock:
            for job in self.jobs:
                job["status"] = "SUCCEEDED"


@pytest.fixture
def service() -> Iterator[tuple[JobService, str]]:
    state = JobService()
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), state.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("durable_operator_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _task(base_url: str) -> Any:
    module = _example()
    dag = next(v for v in vars(module).values() if isinstance(v, DAG))
    task = dag.get_task("rebuild_facts")
    policy.task_policy(task)
    task.base_url, task.poll_interval = base_url, 0.05
    return task


def _context(task: Any, **kwargs: Any) -> dict[str, Any]:
    context = task_context(task, **kwargs)
    context["ti"].stats_tags = {}
    return context


def _two_runs(task: Any, state: JobService) -> None:
    state.failing_status_reads = 1  # the first run's worker loses the job service mid-poll
    with pytest.raises(AirflowException, match="503"):
        task.execute(_context(task, logical_date=NIGHT))
    state.finish()
    rerun = _context(task, run_id="manual__again", conf={"business_date": "2024-02-15"})
    threading.Timer(0.5, state.finish).start()  # a job submitted by the re-run ends too
    task.execute(rerun)


def test_a_second_run_of_the_date_reattaches_to_the_first_runs_job(
    plugin_env: dict[str, str], service: tuple[JobService, str]
) -> None:
    state, url = service
    task = _task(url)
    assert policy.is_wrapped(task)
    _two_runs(task, state)
    assert [j["id"] for j in state.jobs] == ["run-1"]
    assert re.fullmatch(r"[0-9a-f]{64}", state.jobs[0]["key"])


def test_without_the_plugin_the_second_run_submits_again(
    plugin_env: dict[str, str], service: tuple[JobService, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__ENABLED", "False")
    from airflow.sdk.execution_time import task_runner

    from tests.airflow.durable_jobs import AirflowStateStore, JobSystem

    JobSystem(plugin_env["sink"]).create()
    airflow_store = AirflowStateStore(plugin_env["sink"])
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", airflow_store, raising=False)
    original = task_context

    def with_store(task: Any, **kwargs: Any) -> dict[str, Any]:
        context = original(task, **kwargs)
        context["task_state_store"] = airflow_store.accessor(context)
        return context

    monkeypatch.setattr(sys.modules[__name__], "task_context", with_store)
    state, url = service
    _two_runs(_task(url), state)
    assert [j["id"] for j in state.jobs] == ["run-1", "run-2"]


def test_the_guide_shows_the_examples_lines() -> None:
    guide = GUIDE.read_text()
    start = guide.index("## Durable operators")
    block = guide[start:].split("```python\n", 1)[1].split("```", 1)[0]
    source = EXAMPLE.read_text()
    for line in block.splitlines():
        if line.strip() and line.strip() != "...":
            assert line in source, line
