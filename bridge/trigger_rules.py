"""Airflow's trigger rules, decided from the states of a task's direct upstream tasks.

The DAG-run workflow asks ``decide`` once every direct upstream of a task has finished: ``run``
or the state the task ends in without running (``skipped``, ``upstream_failed``), as Airflow's
``TriggerRuleDep`` decides it for a run whose upstreams are all done. Pure and deterministic: the
workflow sandbox imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

RUN = "run"
SUCCESS = "succeeded"
FAILED = "failed"
UPSTREAM_FAILED = "upstream_failed"
SKIPPED = "skipped"

# rule -> (all, success, skipped, failed) -> run or the state; as TriggerRuleDep decides it
_RULES: dict[str, Callable[[int, int, int, int], str]] = {
    "all_success": lambda n, ok, sk, f: RUN if ok == n else (UPSTREAM_FAILED if f else SKIPPED),
    "all_failed": lambda n, ok, sk, f: RUN if f == n else SKIPPED,
    "all_done": lambda n, ok, sk, f: RUN,
    "all_skipped": lambda n, ok, sk, f: RUN if sk == n else SKIPPED,
    "one_success": lambda n, ok, sk, f: RUN if ok else (SKIPPED if sk == n else UPSTREAM_FAILED),
    "one_failed": lambda n, ok, sk, f: RUN if f else SKIPPED,
    "one_done": lambda n, ok, sk, f: RUN if ok or f else SKIPPED,
    "none_failed": lambda n, ok, sk, f: UPSTREAM_FAILED if f else RUN,
    "none_failed_min_one_success": lambda n, ok, sk, f: (
        UPSTREAM_FAILED if f else (RUN if ok else SKIPPED)
    ),
    "none_skipped": lambda n, ok, sk, f: SKIPPED if sk else RUN,
    "all_done_min_one_success": lambda n, ok, sk, f: (
        SKIPPED if sk else (RUN if ok else UPSTREAM_FAILED)
    ),
    "always": lambda n, ok, sk, f: RUN,
}
#: The rules the workflow decides; the inventory refuses any other by name.
RULES = frozenset(_RULES)


def decide(rule: str, upstream: Collection[str]) -> str:
    """``run``, or the state a task with trigger rule ``rule`` ends in without running.

    Args:
        rule: the trigger rule's value (``all_success``, ...).
        upstream: the final states of its direct upstream tasks (``succeeded``, ``failed``,
            ``upstream_failed``, ``skipped``).

    Raises:
        ValueError: a rule not in ``RULES``.
    """
    if rule not in _RULES:
        raise ValueError(f"trigger rule {rule!r} is not translated")
    if not upstream:
        return RUN
    success = sum(s == SUCCESS for s in upstream)
    skipped = sum(s == SKIPPED for s in upstream)
    failed = sum(s in (FAILED, UPSTREAM_FAILED) for s in upstream)
    return _RULES[rule](len(upstream), success, skipped, failed)
