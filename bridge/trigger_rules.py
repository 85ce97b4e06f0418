"""Airflow's trigger rules, decided from the states of a task's direct upstream tasks.

The DAG-run workflow asks ``decide`` once every direct upstream of a task has finished: ``run``
or the state the task ends in without running (``skipped``, ``upstream_failed``), as Airflow's
``TriggerRuleDep`` decides it for a run whose upstreams are all done, setup/teardown included:
a teardown's ``all_done_setup_success`` counts its direct setups, and a work task's relevant
setups that are not its direct upstreams (the "setup constraint") upstream-fail or skip it.
Pure and deterministic: the workflow sandbox imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

RUN = "run"
SUCCESS = "succeeded"
FAILED = "failed"
UPSTREAM_FAILED = "upstream_failed"
SKIPPED = "skipped"
#: A teardown's rule (``as_teardown``, ``@teardown``): run once all upstreams are done and at
#: least one direct setup succeeded; skipped when they all skipped.
ALL_DONE_SETUP_SUCCESS = "all_done_setup_success"

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
RULES = frozenset({*_RULES, ALL_DONE_SETUP_SUCCESS})
_FAILED = (FAILED, UPSTREAM_FAILED)


def decide(
    rule: str,
    upstream: Collection[str],
    *,
    setups: Collection[str] = (),
    indirect_setups: Collection[str] = (),
) -> str:
    """``run``, or the state a task with trigger rule ``rule`` ends in without running.

    As ``TriggerRuleDep``: a task without upstreams, or with rule ``always``, runs; then a failed
    (or upstream-failed) relevant indirect setup upstream-fails the task and a skipped one skips
    it, before its own rule is looked at.

    Args:
        rule: the trigger rule's value (``all_success``, ...).
        upstream: the final states of its direct upstream tasks (``succeeded``, ``failed``,
            ``upstream_failed``, ``skipped``).
        setups: the final states of those direct upstreams that are setup tasks (what
            ``all_done_setup_success`` counts).
        indirect_setups: the final states of its relevant setups that are not direct upstreams
            (``get_upstreams_only_setups``; none for a teardown).

    Raises:
        ValueError: a rule not in ``RULES``.
    """
    if rule not in RULES:
        raise ValueError(f"trigger rule {rule!r} is not translated")
    if not upstream or rule == "always":
        return RUN
    if any(s in _FAILED for s in indirect_setups):
        return UPSTREAM_FAILED
    if SKIPPED in indirect_setups:
        return SKIPPED
    if rule == ALL_DONE_SETUP_SUCCESS:
        if setups and all(s == SKIPPED for s in setups):
            return SKIPPED
        if setups and SUCCESS not in setups:
            return UPSTREAM_FAILED
        return RUN
    success = sum(s == SUCCESS for s in upstream)
    skipped = sum(s == SKIPPED for s in upstream)
    failed = sum(s in _FAILED for s in upstream)
    return _RULES[rule](len(upstream), success, skipped, failed)
