"""The XComs a task hands its downstream tasks besides its return value, and how they are kept.

Airflow keeps every XCom of a run in its metadata DB; the bridge carries them in the workflow:
an activity returns the keys its task pushed (``ti.xcom_push``, and each key of a
``multiple_outputs`` dict, as Airflow's task runner pushes them) beside its result, and the
workflow passes them to the downstream tasks. A task that pushed keys records them with its
lease's result, so an attempt that finds the task succeeded hands the same XComs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.spec import TaskSpec

_MARK = "$bridge_xcoms"
_RETURN = "$return_value"
# kept among the pushed XComs (so the lease records them) and taken out again by ``skips``
_SKIPPED = "$skipped"
_SKIP_DOWNSTREAM = "$skip_downstream"


def note_skip(exc: BaseException, pushed: dict[str, Any]) -> bool:
    """Notes a skip the task raised (``AirflowSkipException``: itself; ``DownstreamTasksSkipped``
    from a branch or short-circuit: those tasks), as Airflow's task runner takes them; False for
    any other exception."""
    kind = type(exc).__name__
    if kind == "AirflowSkipException":
        pushed[_SKIPPED] = True
        return True
    if kind == "DownstreamTasksSkipped":
        tasks = getattr(exc, "tasks", ())
        tasks = tasks if isinstance(tasks, list | tuple) else [tasks]
        pushed[_SKIP_DOWNSTREAM] = sorted(
            {str(t[0] if isinstance(t, list | tuple) else t) for t in tasks}
        )
        return True
    return False


def skips(pushed: dict[str, Any]) -> tuple[bool, tuple[str, ...]]:
    """Takes the noted skips out of ``pushed``: (skipped itself, downstream tasks it skipped)."""
    skipped = bool(pushed.pop(_SKIPPED, False))
    return skipped, tuple(pushed.pop(_SKIP_DOWNSTREAM, ()))


def xcoms_of(spec: TaskSpec, result: Any, pushed: Mapping[str, Any]) -> dict[str, Any]:
    """The XComs other than the return value a task's run leaves (pushed, then its
    ``multiple_outputs`` keys, which win as in Airflow)."""
    found = dict(pushed)
    if spec.multiple_outputs and isinstance(result, Mapping):
        found.update({str(k): v for k, v in result.items()})
    return found


def encode(result: Any, pushed: Mapping[str, Any]) -> Any:
    """What the lease records: the result alone when nothing was pushed."""
    if not pushed:
        return result
    return {_MARK: dict(pushed), _RETURN: result}


def decode(recorded: Any) -> tuple[Any, dict[str, Any]]:
    """A recorded result and the XComs pushed with it (``multiple_outputs`` keys are not
    recorded: they are the result's own)."""
    if isinstance(recorded, Mapping) and set(recorded) == {_MARK, _RETURN}:
        return recorded[_RETURN], dict(recorded[_MARK])
    return recorded, {}
