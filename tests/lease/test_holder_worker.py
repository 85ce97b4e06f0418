"""The holder names the executor worker it runs in (a Celery node name), so a try re-delivered
to another worker on the same machine is a different holder in the audit trail."""

from __future__ import annotations

import multiprocessing
import sys
import types
from typing import Any

import pytest

from airflow_plugins.lease import Holder
from airflow_plugins.lease.holder import WORKER_ENV, executor_worker


def test_no_worker_outside_an_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKER_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "celery._state", raising=False)
    assert Holder.process("script").worker is None
    assert "worker" not in Holder.process("script").to_json()


def test_the_environment_names_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_ENV, "billing-pod-7f9c")
    holder = Holder.airflow(dag_id="d", run_id="r", task_id="t", try_number=1)
    assert holder.worker == "billing-pod-7f9c"
    assert holder.to_json()["worker"] == "billing-pod-7f9c"
    assert "billing-pod-7f9c" in holder.describe()


def test_a_stored_holder_keeps_its_own_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_ENV, "the-reader")
    stored = {"engine": "airflow", "host": "h", "pid": 1, "dag_id": "d", "try_number": 1}
    assert Holder.from_json(stored).worker is None
    assert Holder.from_json({**stored, "worker": "worker-b@h"}).worker == "worker-b@h"


def test_a_broken_celery_state_is_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise RuntimeError("no app")

    monkeypatch.delenv(WORKER_ENV, raising=False)
    monkeypatch.setitem(
        sys.modules, "celery._state", types.SimpleNamespace(get_current_task=broken)
    )
    assert executor_worker() is None


def _forked_holder(queue: Any) -> None:
    queue.put(Holder.airflow(dag_id="d", run_id="r", task_id="t", try_number=1).worker)


def test_a_process_forked_inside_a_celery_task_names_its_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As Airflow's Celery task runs a try: the task forks the supervisor, which forks the
    task process; the Celery task being executed is still in the forked memory."""
    celery = pytest.importorskip("celery")
    monkeypatch.delenv(WORKER_ENV, raising=False)
    app = celery.Celery("holder-test", set_as_current=False)
    ctx = multiprocessing.get_context("fork")

    @app.task(name="run_try")  # type: ignore[untyped-decorator]
    def run_try() -> tuple[str, str | None]:
        queue = ctx.Queue()
        child = ctx.Process(target=_forked_holder, args=(queue,))
        child.start()
        worker: str | None = queue.get(timeout=30)
        child.join(30)
        return str(run_try.request.hostname), worker

    # apply() runs the task here, as a worker's pool process does, under this host's name
    node, worker = run_try.apply().get()
    assert node
    assert worker == node
