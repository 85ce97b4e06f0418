"""The per-task comparison of a whole-DAG shadow (``bridge.task_comparison``), on the values
the worker gets from Airflow's REST API and from the shadow workflow's result."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_plugins.demo.airflow_api import AirflowApiError
from bridge.comparison import digest
from bridge.spec import DagRunResult, RunMode, TaskOutcome
from bridge.task_comparison import TaskSide, differences, run_state, shadow_tasks


def _shadow(**tasks: TaskOutcome) -> DagRunResult:
    return DagRunResult("d", "2024-02-15", RunMode.SHADOW, "success", dict(tasks))


def test_states_branches_and_every_xcom_key_are_compared_not_durations() -> None:
    shadow = shadow_tasks(
        _shadow(
            extract=TaskOutcome("succeeded", ["a"], duration_ms=40),
            bulk=TaskOutcome("skipped"),
            report=TaskOutcome("succeeded", {"n": 1}, xcoms={"n": 1}, duration_ms=5),
        )
    )
    assert shadow["report"].xcoms == {"return_value": digest({"n": 1}), "n": digest(1)}
    airflow = {
        "extract": TaskSide("success", 900, {"return_value": digest(["a"])}),
        "bulk": TaskSide("skipped", None, {}),
        "report": TaskSide("success", 300, {"return_value": digest({"n": 1}), "n": digest(1)}),
    }
    assert differences(airflow, shadow) == []
    assert run_state(airflow) == "success"

    airflow["bulk"] = TaskSide("success", 10, {})  # Airflow's branch took another way
    airflow["report"] = TaskSide("success", 300, {"return_value": digest({"n": 2}), "n": digest(1)})
    assert differences(airflow, shadow) == [
        {"what": "state", "task": "bulk", "primary": "success", "shadow": "skipped"},
        {
            "what": "xcom",
            "task": "report",
            "key": "return_value",
            "primary": digest({"n": 2}),
            "shadow": digest({"n": 1}),
        },
    ]


def test_a_task_missing_on_one_side_or_still_running_is_told() -> None:
    shadow = shadow_tasks(_shadow(extract=TaskOutcome("failed", error="boom")))
    assert differences({}, shadow) == [
        {"what": "state", "task": "extract", "primary": "missing", "shadow": "failed"}
    ]
    assert run_state({"extract": TaskSide("running", None, {})}) == "running"
    assert run_state({"extract": TaskSide("upstream_failed", None, {})}) == "failed"


class _MappedApi:
    """Airflow's REST API for one run whose task ``greet`` is mapped over three items (item 1
    returned None: Airflow pushed no XCom for it), as the api-server answers."""

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return [
            {"task_id": "greet", "map_index": 2, "state": "success", "duration": 0.2},
            {"task_id": "greet", "map_index": 0, "state": "success", "duration": 0.1},
            {"task_id": "greet", "map_index": 1, "state": "success", "duration": 0.1},
        ]

    def request(self, method: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
        assert path.endswith("/taskInstances/greet/xcomEntries/return_value"), path
        index = params["map_index"]
        if index == 1:
            raise AirflowApiError("404 not found", 404)
        return {"value": f"hi {index}"}

    def close(self) -> None:
        pass


def test_a_mapped_task_is_compared_as_its_list_in_map_index_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bridge import airflow_side

    monkeypatch.setattr(airflow_side, "_api", _MappedApi)
    airflow = airflow_side.airflow_tasks("d", "manual__1")
    assert airflow["greet"].xcoms == {"return_value": digest(["hi 0", "hi 2"])}
    assert airflow["greet"].ms == 400
    shadow = shadow_tasks(
        _shadow(greet=TaskOutcome("succeeded", ["hi 0", "hi 2"], items={"a": "hi 0"}))
    )
    assert differences(airflow, shadow) == []
    reordered = shadow_tasks(_shadow(greet=TaskOutcome("succeeded", ["hi 2", "hi 0"])))
    assert [d["what"] for d in differences(airflow, reordered)] == ["xcom"]


def test_a_failed_teardown_does_not_fail_the_airflow_side_unless_it_decides_the_run() -> None:
    tasks = {
        "create": TaskSide("success", 1, {}),
        "work": TaskSide("success", 1, {}),
        "delete": TaskSide("failed", 1, {}),
    }
    assert run_state(tasks, decisive={"work"}) == "success"  # as Airflow: teardowns left out
    assert run_state(tasks, decisive={"delete"}) == "failed"  # on_failure_fail_dagrun
    assert run_state(tasks) == "failed"


def test_a_mapped_task_still_at_work_on_airflow_is_running_not_failed() -> None:
    from bridge.airflow_side import mapped_state

    # the comparison waits for it (run_state sees running) instead of judging it failed
    assert mapped_state(["success", "running"]) == "running"
    assert mapped_state(["success", "queued", "failed"]) == "running"
    assert mapped_state(["success", "upstream_failed"]) == "failed"
    assert mapped_state(["skipped", "skipped"]) == "skipped"
    # as the workflow merges: items that skipped themselves beside ones that ran
    assert mapped_state(["success", "skipped"]) == "success"
    assert mapped_state(["success", "success"]) == "success"
