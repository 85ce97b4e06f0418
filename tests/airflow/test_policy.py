"""The cluster policy on a parsed DAG folder: who is wrapped, the warnings, the wrapped outcomes.

Self-fencing is shown in a child process (a process-group leader, as Airflow starts task
processes): its lease is force-released while its BashOperator's shell sleeps; the keeper's
next renewal fails and the policy kills the shell and the task process with SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from airflow import settings
from airflow.dag_processing.dagbag import DagBag

from airflow_plugins.lease import LeaseStore
from airflow_plugins.protection import policy
from tests.airflow.conftest import task_context
from tests.conftest import store_backends
from tests.lease.waiting import wait_for

DAGS = Path(__file__).parent / "dags"
NIGHT = datetime(2024, 2, 15, 2, tzinfo=UTC)
WORKER = Path(__file__).parent / "self_fence_worker.py"


@contextmanager
def _policy_registered() -> Iterator[None]:
    """The policy registered for a parse (as its entry point does)."""
    manager = settings.get_policy_plugin_manager()
    registered_here = not manager.is_registered(policy)
    if registered_here:
        manager.register(policy)
    try:
        yield
    finally:
        if registered_here:
            manager.unregister(policy)


@pytest.fixture
def bag(caplog: pytest.LogCaptureFixture) -> Iterator[DagBag]:
    """The test DAG folder parsed with the policy registered."""
    caplog.set_level(logging.WARNING, logger="airflow_plugins.protection.policy")
    with _policy_registered():
        yield DagBag(str(DAGS))


@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "runs.txt"
    path.touch()
    monkeypatch.setenv("EO_POLICY_COUNTER", str(path))
    return path


def test_opted_in_tasks_are_wrapped_and_others_are_not(bag: DagBag) -> None:
    assert bag.import_errors == {}
    tagged = bag.dags["policy_tagged"]
    wrapped = {t.task_id for t in tagged.tasks if policy.is_wrapped(t)}
    assert wrapped == {"py", "py_once", "deco", "bash", "per_tenant"}
    assert not policy.is_wrapped(tagged.get_task("fan"))  # mapped, unnamed: warned, not wrapped
    assert not policy.is_wrapped(tagged.get_task("already"))  # protected by its operator
    assert tagged.get_task("py").retries == 4  # the protected default
    assert tagged.get_task("py_once").retries == 0  # the author's choice is kept
    untagged = bag.dags["policy_untagged"]
    assert not any(policy.is_wrapped(t) for t in untagged.tasks)


def test_each_wrapped_task_is_warned_about_its_missing_fence(
    bag: DagBag, caplog: pytest.LogCaptureFixture
) -> None:
    parsed = caplog.get_records("setup")  # the DagBag is parsed in the fixture
    messages = [r.getMessage() for r in parsed if r.name == "airflow_plugins.protection.policy"]
    for task_id in ("py", "deco", "bash"):
        assert any(
            f"policy_tagged.{task_id} wrapped" in m and "uses no fence" in m for m in messages
        ), (task_id, messages)
    assert any(
        "policy_tagged.fan is a mapped task without a map_index_template and is NOT protected" in m
        for m in messages
    )
    assert any("policy_tagged.per_tenant wrapped" in m for m in messages)
    assert not any("policy_untagged" in m for m in messages)
    assert not any("policy_tagged.already" in m for m in messages)


def test_run_conf_cannot_turn_the_policy_off(bag: DagBag) -> None:
    # opting in is decided at parse time: a run's conf never reaches the policy
    task = bag.dags["policy_tagged"].get_task("py")
    assert policy.is_wrapped(task)
    context = task_context(task, logical_date=NIGHT, conf={"exactly_once": False})
    assert context["task"].execute.__name__ == "_execute"


@pytest.mark.parametrize(
    ("task_id", "value"), [("py", "py done"), ("deco", "deco done"), ("bash", "bash done")]
)
def test_a_wrapped_task_runs_once_per_business_date(
    bag: DagBag, counter: Path, plugin_env: dict[str, str], task_id: str, value: str
) -> None:
    task = bag.dags["policy_tagged"].get_task(task_id)
    first = task.execute(context=task_context(task, logical_date=NIGHT))
    cleared = task.execute(context=task_context(task, logical_date=NIGHT, try_number=2))
    second_run = task.execute(
        context=task_context(task, run_id="manual__2", conf={"business_date": "2024-02-15"})
    )
    assert first == cleared == second_run == value
    assert counter.read_text().splitlines() == [task_id]
    with LeaseStore(plugin_env["lease"]) as store:
        row = store.get(f"policy_tagged/{task_id}/2024-02-15")
    assert row is not None
    assert row["state"] == "succeeded"
    assert row["result"] == value


def test_a_wrapped_mapped_task_runs_once_per_tenant(
    bag: DagBag, counter: Path, plugin_env: dict[str, str]
) -> None:
    mapped = bag.dags["policy_tagged"].get_task("per_tenant")
    assert mapped.retries == 4
    first = mapped.unmap({"op_kwargs": {"tenant": "acme"}})
    assert policy.is_wrapped(first)
    # Airflow could not render "{{ tenant }}" before the work: the key renders it from the
    # task's arguments
    context = task_context(first, logical_date=NIGHT, map_index=0)
    context["map_index_template"] = first.map_index_template
    assert first.execute(context=context) == "tenant acme done"
    # the tenant list changed: acme is now at position 1; it is not run again
    moved = mapped.unmap({"op_kwargs": {"tenant": "acme"}})
    context = task_context(
        moved, logical_date=NIGHT, map_index=1, rendered_map_index="acme", try_number=2
    )
    assert moved.execute(context=context) == "tenant acme done"
    # Airflow renders the template again after the try, from the context, even though the
    # body did not run this time
    env = context["dag"].get_template_env()
    assert env.from_string(moved.map_index_template).render(context) == "acme"
    assert counter.read_text().splitlines() == ["tenant acme"]
    with LeaseStore(plugin_env["lease"]) as store:
        row = store.get("policy_tagged/per_tenant/2024-02-15/acme")
    assert row is not None
    assert row["state"] == "succeeded"


def test_an_untagged_task_runs_plainly(
    bag: DagBag, counter: Path, plugin_env: dict[str, str]
) -> None:
    task = bag.dags["policy_untagged"].get_task("py")
    task.execute(context=task_context(task, logical_date=NIGHT))
    task.execute(context=task_context(task, logical_date=NIGHT, try_number=2))
    assert counter.read_text().splitlines() == ["untagged", "untagged"]


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and "self_fence_worker" not in cmdline:
            found.append(int(entry.name))
    return found


def _wait(condition: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not met within {timeout} s"
        time.sleep(0.05)
    return value


@pytest.mark.slow
def test_lease_loss_kills_the_wrapped_bash_task_and_its_shell(plugin_env: dict[str, str]) -> None:
    marker = f"{uuid.uuid4().int % 1000 + 100}.{uuid.uuid4().int % 9000 + 1000}"
    env = {**os.environ, "EO_LEASE_DSN": plugin_env["lease"], "EO_SLEEP": marker}
    child = subprocess.Popen(
        [sys.executable, str(WORKER)],
        env=env,
        cwd=Path(__file__).parents[2],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        key = "self_fence/bash/2024-02-15"
        with LeaseStore(plugin_env["lease"]) as store:
            _wait(lambda: (store.get(key) or {}).get("state") == "running")
            shells = _wait(lambda: _processes_with(f"sleep {marker}"))
            store.force_release(key, actor="test", reason="another holder owns it now")
        assert child.wait(timeout=60) == -signal.SIGKILL
        _wait(lambda: not _processes_with(f"sleep {marker}"), timeout=20)
        assert shells
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        output = child.communicate(timeout=30)[0].decode()
        for pid in _processes_with(f"sleep {marker}"):
            os.kill(pid, signal.SIGKILL)
    assert "killing the task's processes" in output


@pytest.mark.parametrize("task_id", ["already", "py"])  # ExactlyOnceOperator; wrapped
def test_parsing_to_run_a_protected_task_warms_the_connection_its_try_uses(
    monkeypatch: pytest.MonkeyPatch, counter: Path, plugin_env: dict[str, str], task_id: str
) -> None:
    # the task runner parses the DAG file with the parsing context naming the task it runs
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "policy_tagged")
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", task_id)
    opened: list[str] = []
    real_connect = psycopg.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("application_name") == "runlease":  # the lease store's connections
            opened.append(str(args[0]))
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", connect)
    with _policy_registered():
        task = DagBag(str(DAGS)).dags["policy_tagged"].get_task(task_id)
    warmed = wait_for(lambda: store_backends(plugin_env["lease"]))
    assert len(warmed) == 1

    task.execute(context=task_context(task, logical_date=NIGHT))
    # the try (acquire, complete) ran on the warmed connection: no second one was opened; and
    # the try closed it when it was done, not leaving it to the process's end
    assert len(opened) == 1
    assert wait_for(lambda: not store_backends(plugin_env["lease"]))  # its backend ends
    with LeaseStore(plugin_env["lease"]) as store:
        row = store.get(f"policy_tagged/{task_id}/2024-02-15")
    assert row is not None
    assert row["state"] == "succeeded"


@pytest.mark.parametrize("task_id", ["bash", "per_tenant"])  # wrapped; wrapped and mapped
def test_a_wrapped_task_acquires_once_its_templates_are_rendered(
    monkeypatch: pytest.MonkeyPatch, counter: Path, plugin_env: dict[str, str], task_id: str
) -> None:
    # the task runner parses the DAG file to run the task, renders its templates (a mapped task
    # is unmapped there), then executes it: the acquire starts at the rendering, and execute
    # takes its answer (one acquire in the audit)
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "policy_tagged")
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", task_id)
    with _policy_registered():
        parsed = DagBag(str(DAGS)).dags["policy_tagged"].get_task(task_id)
    mapped = task_id == "per_tenant"
    context = task_context(parsed, logical_date=NIGHT, map_index=0 if mapped else -1)
    if mapped:  # the first of ["acme", "globex"]
        context["map_index_template"] = parsed.map_index_template
    parsed.render_template_fields(context)
    task = context["task"]  # the task Airflow runs (the unmapped one, for a mapped task)
    key = f"policy_tagged/{task_id}/2024-02-15" + ("/acme" if mapped else "")
    with LeaseStore(plugin_env["lease"]) as store:
        assert wait_for(lambda: store.get(key))  # taken before execute
        task.execute(context=context)
        row = store.get(key)
        acquires = [h["outcome"] for h in store.history(key) if h["event"] == "acquire"]
    assert row is not None
    assert row["state"] == "succeeded"
    assert acquires == ["granted"]
    assert counter.read_text().splitlines() == ["tenant acme" if mapped else task_id]


@pytest.mark.parametrize(
    ("dag_id", "task_id"),
    [
        (None, None),  # the dag processor: no task named
        ("policy_untagged", "py"),  # a task runner about to run an unprotected task
    ],
)
def test_other_parses_open_no_lease_connection(
    monkeypatch: pytest.MonkeyPatch,
    plugin_env: dict[str, str],
    dag_id: str | None,
    task_id: str | None,
) -> None:
    if dag_id and task_id:
        monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", dag_id)
        monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", task_id)
    with _policy_registered():
        assert DagBag(str(DAGS)).import_errors == {}
    time.sleep(1.0)  # a warm-up would have connected by now (it takes milliseconds)
    assert store_backends(plugin_env["lease"]) == []
