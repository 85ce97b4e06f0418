"""The inventory tells the truth: what the worker does not run the same is refused, by task
name, construct and reason, before anything runs; what it runs stays translatable.

DAG objects are built in-process, in the styles the Airflow docs teach; nothing runs (no Airflow
component, no Temporal server).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.python import (
    ExternalPythonOperator,
    PythonOperator,
    PythonVirtualenvOperator,
)
from airflow.sdk import DAG, Asset, get_current_context, setup, task, task_group, teardown
from airflow.sdk.exceptions import AirflowSkipException

from bridge.graph import run_state_tasks
from bridge.in_airflow.code_use import WORKER_CONTEXT
from bridge.in_airflow.translate import Translation, Untranslatable, inventory, translate
from bridge.spec import UPSTREAM_MARKER, DagSpec, TaskKind, TaskSpec
from bridge.trigger_rules import RUN, SKIPPED, UPSTREAM_FAILED, decide
from bridge.worker.execution import business_run, run_operator, template_context
from tests.bridge.conftest import REPO
from tests.bridge.corpus import corpus_dags, dag_bag

START = pendulum.datetime(2024, 1, 1, tz="UTC")


def _dag(dag_id: str) -> DAG:
    return DAG(dag_id, schedule="0 2 * * *", start_date=START)


def refused(translation: Translation, task_id: str, construct: str, *words: str) -> Untranslatable:
    """The refusal of ``task_id`` for ``construct``; its reason and the report say ``words``."""
    report = translation.report()
    assert report.startswith(f"{translation.dag_id}: NOT translatable"), report
    assert translation.spec is None
    found = [u for u in translation.untranslatable if u.task_id == task_id]
    match = [u for u in found if u.construct == construct]
    assert match, f"{task_id} not refused for {construct!r}: {report}"
    for word in words:
        assert word in match[0].reason, report
    assert f"{task_id} (" in report
    assert f"[{construct}]: {match[0].reason}" in report
    return match[0]


def _business_date() -> str:
    return str(get_current_context()["ds"])  # a helper the callable calls


# --- python callables using the context -----------------------------------------------------


def _runs_through_execute(translation: Translation, *task_ids: str) -> None:
    """The tasks translate and the worker runs them through their operator's execute (with
    the worker's context), as Airflow's task runner does."""
    assert translation.ok, translation.report()
    assert translation.spec is not None
    for task_id in task_ids:
        assert translation.spec.task(task_id).kind is TaskKind.EXECUTE, task_id


def test_a_context_argument_runs_through_execute() -> None:
    with _dag("ctx_arg") as dag:

        @task
        def report(ti: Any = None) -> str:
            return str(ti.run_id)

        report()
    _runs_through_execute(translate(dag), "report")


def test_kwargs_and_ds_of_a_python_operator_run_through_execute() -> None:
    def print_context(ds: str, **kwargs: Any) -> str:
        return ds

    with _dag("ctx_kwargs") as dag:
        PythonOperator(task_id="print_the_context", python_callable=print_context)
    _runs_through_execute(translate(dag), "print_the_context")


def test_a_context_argument_or_read_the_worker_lacks_is_refused() -> None:
    def run_this(inlet_events: Any) -> None:
        pass

    def prev(**context: Any) -> Any:
        return context["prev_data_interval_start_success"]

    with _dag("ctx_missing") as dag:
        PythonOperator(task_id="run_this", python_callable=run_this)
        PythonOperator(task_id="prev", python_callable=prev)
    translation = translate(dag)
    refused(translation, "run_this", "context argument", "'inlet_events'", "lacks")
    refused(translation, "prev", "context variable", "prev_data_interval_start_success")


def test_state_stores_and_test_mode_run_through_execute() -> None:
    """Airflow 3.3's task and asset state stores are in the worker's context (the lease's task
    state, ``bridge.asset_state``); ``test_mode`` keeps its default, as in Airflow."""

    def run_job(task_state_store: Any = None, test_mode: Any = None) -> Any:
        return task_state_store.get("job_id")

    def watermark(asset_state_store: Any = None) -> Any:
        return asset_state_store.get("watermark")

    with _dag("ctx_state") as dag:
        PythonOperator(task_id="run_job", python_callable=run_job)
        PythonOperator(
            task_id="watermark",
            python_callable=watermark,
            inlets=[Asset(name="orders", uri="s3://b/orders")],
        )
    translation = translate(dag)
    _runs_through_execute(translation, "run_job")
    _runs_through_execute(translation, "watermark")


def test_templates_dict_runs_through_execute() -> None:
    def load(templates_dict: dict[str, str]) -> str:
        return templates_dict["day"]

    with _dag("ctx_templates_dict") as dag:
        PythonOperator(task_id="load", python_callable=load, templates_dict={"day": "{{ ds }}"})
    _runs_through_execute(translate(dag), "load")


def test_a_fenced_callable_taking_the_context_is_refused() -> None:
    def charge(fence: Any, ds: str) -> str:
        return ds

    with _dag("ctx_fenced") as dag:
        PythonOperator(task_id="charge", python_callable=charge)
    refused(translate(dag), "charge", "context argument", "fenced or mapped callable")


def test_an_argument_passed_by_the_task_is_not_a_context_argument() -> None:
    def load(params: dict[str, int]) -> int:
        return params["n"]

    with _dag("ctx_passed") as dag:
        PythonOperator(task_id="load", python_callable=load, op_kwargs={"params": {"n": 1}})
    assert translate(dag).ok, translate(dag).report()


def test_get_current_context_in_a_helper_runs_through_execute() -> None:
    with _dag("ctx_current") as dag:

        @task
        def extract() -> str:
            return _business_date()

        extract()
    _runs_through_execute(translate(dag), "extract")


# --- XCom keys -------------------------------------------------------------------------------


def test_xcom_push_and_pull_of_keys_in_callables_run_through_execute() -> None:
    with _dag("xcom_keys") as dag:

        @task
        def push(ti: Any = None) -> None:
            ti.xcom_push(key="order_data", value={"a": 1})

        @task
        def pull(ti: Any = None) -> Any:
            return ti.xcom_pull(task_ids="push", key="order_data")

        push() >> pull()
    _runs_through_execute(translate(dag), "push", "pull")


def test_a_callable_pulling_a_task_that_is_not_upstream_is_refused() -> None:
    with _dag("xcom_unwired") as dag:

        @task
        def side() -> int:
            return 1

        @task
        def reader(ti: Any = None) -> Any:
            return ti.xcom_pull(task_ids="side")

        side()
        reader()
    refused(translate(dag), "reader", "xcom_pull task_ids", "'side'", "not upstream")


def test_a_template_pulling_a_key_runs() -> None:
    with _dag("xcom_template_key") as dag:
        first = BashOperator(task_id="first", bash_command="echo 1")
        second = BashOperator(
            task_id="second",
            bash_command="echo {{ ti.xcom_pull(task_ids='first', key='manually_pushed') }}",
        )
        first >> second
    _runs_through_execute(translate(dag), "first", "second")


def test_a_template_pulling_a_task_that_is_not_upstream_is_refused() -> None:
    with _dag("xcom_template_unwired") as dag:
        BashOperator(task_id="side", bash_command="echo 1")
        BashOperator(task_id="reader", bash_command="echo {{ ti.xcom_pull(task_ids='side') }}")
    refused(translate(dag), "reader", "xcom_pull task_ids", "'side'", "not upstream")


def test_consumers_of_multiple_outputs_keys_run_through_execute() -> None:
    with _dag("multiple_outputs") as dag:

        @task(multiple_outputs=True)
        def totals() -> dict[str, int]:
            return {"total_order_value": 3}

        @task
        def show(value: int) -> int:
            return value

        @task
        def whole(values: dict[str, int]) -> int:
            return values["total_order_value"]

        made = totals()
        show(made["total_order_value"])
        whole(made)
    translation = translate(dag)
    _runs_through_execute(translation, "show")
    assert translation.spec is not None
    assert translation.spec.task("totals").multiple_outputs
    # the whole dict is also the return value: passed on as an argument, no context needed
    assert translation.spec.task("whole").kind is TaskKind.PYTHON


# --- how the callable is run -----------------------------------------------------------------


def test_an_async_callable_is_awaited_a_fenced_one_is_refused() -> None:
    """Its operator's execute runs the coroutine to completion, as Airflow's task runner does;
    a mapped one is called with its arguments and its coroutine run to completion by the
    activity; a fenced one keeps its rule (its arguments only, no event loop)."""
    with _dag("async_def") as dag:

        @task
        async def fetch() -> list[int]:
            return [1, 2]

        @task
        async def each(n: int) -> int:
            return n

        each.expand(n=fetch())
    translation = translate(dag)
    _runs_through_execute(translation, "fetch")
    assert translation.spec is not None
    assert translation.spec.task("each").kind is TaskKind.PYTHON

    async def charge(fence: Any) -> None:
        pass

    with _dag("async_fenced") as fenced:
        PythonOperator(task_id="charge", python_callable=charge)
    refused(translate(fenced), "charge", "async def", "fenced or mapped callable")


def test_task_bash_runs_through_execute_a_mapped_one_is_refused() -> None:
    """Its operator's execute calls the function and runs the command with bash (the corpus
    comparison's semantics_dags/bash_decorator.py shows the same states and XComs)."""
    with _dag("task_bash") as dag:

        @task.bash
        def run_me() -> str:
            return "echo hello"

        @task.bash
        def each(n: int) -> str:
            return f"echo {n}"

        run_me() >> BashOperator(task_id="plain", bash_command="echo {{ ds }}")
        each.expand(n=[1, 2])
    translation = translate(dag)
    assert {u.task_id for u in translation.untranslatable} == {"each"}, translation.report()
    refused(translation, "each", "@task.bash", "never run bash")
    with _dag("task_bash_alone") as alone:

        @task.bash
        def only() -> str:
            return "echo hello"

        only()
    _runs_through_execute(translate(alone), "only")


def test_task_virtualenv_runs_through_its_operators_execute() -> None:
    with _dag("task_venv") as dag:

        @task.virtualenv(requirements=["colorama==0.4.0"])
        def in_venv() -> None:
            pass

        def classic(n: int) -> int:
            return n

        in_venv() >> PythonVirtualenvOperator(
            task_id="classic", python_callable=classic, op_args=[1]
        )
    _runs_through_execute(translate(dag), "in_venv", "classic")


def test_task_external_python_runs_through_its_operators_execute() -> None:
    with _dag("task_external") as dag:

        @task.external_python(python=sys.executable)
        def elsewhere() -> None:
            pass

        def classic() -> None:
            pass

        elsewhere() >> ExternalPythonOperator(
            task_id="classic", python=sys.executable, python_callable=classic
        )
    _runs_through_execute(translate(dag), "elsewhere", "classic")


def test_own_environment_callables_the_worker_cannot_run_the_same_are_refused() -> None:
    with _dag("task_venv_refused") as dag:

        @task.virtualenv(requirements=["colorama==0.4.0"])
        def each(n: int) -> int:
            return n

        @task.external_python(python=sys.executable)
        def reads_variable() -> str:
            from airflow.sdk import Variable

            return str(Variable.get("x"))

        @task.virtualenv(system_site_packages=True)
        def prior(prev_data_interval_start_success: Any = None) -> str:
            return str(prev_data_interval_start_success)

        @task.branch_external_python(python=sys.executable)
        def pick() -> str:
            from airflow.sdk import get_current_context

            return str(get_current_context()["ds"])

        each.expand(n=[1, 2])
        reads_variable()
        prior()
        pick()
    translation = translate(dag)
    refused_ids = {u.task_id for u in translation.untranslatable}
    assert refused_ids == {"each", "reads_variable", "prior", "pick"}, translation.report()
    refused(translation, "each", "_PythonVirtualenvDecoratedOperator", "mapped", "in-process")
    refused(translation, "reads_variable", "Airflow in own environment", "task supervisor")
    refused(translation, "prior", "context argument", "prev_data_interval_start_success")
    refused(translation, "pick", "Airflow in own environment", "task supervisor")


def test_an_external_python_task_runs_in_its_interpreter_with_the_workers_context() -> None:
    with _dag("external_run") as dag:

        def where(day: str, ds: Any = None, ti: Any = None) -> str:
            import sys

            # ti is not among the keys the operator serializes for the other interpreter
            return f"{day}|{ds}|{ti}|{sys.executable}"

        op = ExternalPythonOperator(
            task_id="where",
            python=sys.executable,
            python_callable=where,
            op_kwargs={"day": "{{ ds_nodash }}"},
            expect_airflow=False,
        )
    _runs_through_execute(translate(dag), "where")
    run, ds = business_run("external_run", "r", "2024-01-02", period="day", timezone="UTC")
    context = template_context(op, run=run, try_number=1, upstream={}, ds=ds)
    assert run_operator(op, context) == f"20240102|2024-01-02|None|{sys.executable}"


def test_a_generator_runs_through_execute_a_mapped_or_fenced_one_is_refused() -> None:
    """Its operator's execute drains it as Airflow's does (semantics_dags/generator_tasks.py in
    the corpus comparison); a mapped or fenced one would be called, never drained."""
    with _dag("generators") as dag:

        @task
        def drained() -> Any:
            yield 1
            return 2

        @task
        def each(n: int) -> Any:
            yield n

        def charge(fence: Any) -> Any:
            yield 1

        drained()
        each.expand(n=[1, 2])
        PythonOperator(task_id="charge", python_callable=charge)
    translation = translate(dag)
    assert {u.task_id for u in translation.untranslatable} == {"each", "charge"}
    refused(translation, "each", "generator", "fenced or mapped callable")
    refused(translation, "charge", "generator", "fenced or mapped callable")
    with _dag("generator_alone") as alone:

        @task
        def only() -> Any:
            yield 1

        only()
    _runs_through_execute(translate(alone), "only")


def test_raising_airflow_skip_exception_translates() -> None:
    with _dag("skip_exc") as dag:

        @task
        def maybe(n: int) -> int:
            if n < 0:
                raise AirflowSkipException("nothing to do")
            return n

        maybe(1)
    translation = translate(dag)
    assert translation.ok, translation.report()


def test_branching_runs_through_execute_with_its_trigger_rules() -> None:
    with _dag("branchy") as dag:

        @task.branch
        def choose() -> str:
            return "left"

        @task
        def left() -> int:
            return 1

        @task
        def right() -> int:
            return 2

        @task(trigger_rule="none_failed_min_one_success")
        def join() -> None:
            pass

        chosen = choose()
        chosen >> [left(), right()] >> join()
    translation = translate(dag)
    _runs_through_execute(translation, "choose")
    assert translation.spec is not None
    assert translation.spec.task("join").trigger_rule == "none_failed_min_one_success"
    assert translation.spec.task("join").upstream == ("left", "right")


def test_a_retry_policy_is_refused() -> None:
    from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule

    policy = ExceptionRetryPolicy(rules=[RetryRule(exception=ValueError, action=RetryAction.FAIL)])
    with _dag("retry_policy") as dag:

        @task(retries=2, retry_policy=policy)
        def call() -> None:
            pass

        call()
    refused(translate(dag), "call", "retry policy", "per exception")


def test_latest_only_runs_through_execute_reading_the_airflow_run() -> None:
    """Its own ``choose_branch`` runs in the worker with the Airflow run handed over; a run
    without one is refused before anything runs (test_airflow_run, test_corpus_truth)."""
    from airflow.providers.standard.operators.latest_only import LatestOnlyOperator

    with _dag("latest") as dag:
        LatestOnlyOperator(task_id="latest_only") >> BashOperator(task_id="b", bash_command="true")
    translation = translate(dag)
    _runs_through_execute(translation, "latest_only")
    assert translation.spec is not None
    assert translation.spec.task("latest_only").reads_airflow_run == "latest only"
    assert translation.spec.task("b").reads_airflow_run == ""


def test_run_if_runs_through_execute_a_mapped_or_protected_one_is_refused() -> None:
    """The worker runs the hooks around the operator's execute as the task runner does
    (semantics_dags/execute_hooks.py in the corpus comparison); a mapped or protected
    callable is called with its arguments only."""
    with _dag("run_if") as dag:

        @task.run_if(lambda context: context["ds"] > "2024")
        @task
        def sometimes() -> None:
            pass

        @task.skip_if(lambda context: True)
        @task
        def each(n: int) -> int:
            return n

        def charge(fence: Any) -> None:
            pass

        sometimes()
        each.expand(n=[1, 2])
        PythonOperator(task_id="charge", python_callable=charge, pre_execute=lambda c: None)
        BashOperator(task_id="bash", bash_command="true", post_execute=lambda c, r: None)
    translation = translate(dag)
    assert {u.task_id for u in translation.untranslatable} == {"each", "charge"}
    refused(translation, "each", "run_if/skip_if/pre_execute", "mapped")
    refused(translation, "charge", "run_if/skip_if/pre_execute", "protected")
    with _dag("run_if_alone") as alone:

        @task.run_if(lambda context: context["ds"] > "2024")
        @task
        def only() -> None:
            pass

        only() >> BashOperator(task_id="bash", bash_command="true", post_execute=lambda c, r: None)
    _runs_through_execute(translate(alone), "only", "bash")


# --- dynamic task mapping --------------------------------------------------------------------


def test_mapping_over_a_mapped_task_maps_over_its_list() -> None:
    with _dag("map_over_mapped") as dag:

        @task
        def numbers() -> list[int]:
            return [1, 2, 3]

        @task
        def times_2(x: int) -> int:
            return 2 * x

        @task
        def add_10(x: int) -> int:
            return x + 10

        add_10.expand(x=times_2.expand(x=numbers()))
    spec = _spec(translate(dag))
    assert spec["times_2"].map_over == "numbers"
    assert spec["add_10"].map_over is None
    assert spec["add_10"].expand == (("x", {UPSTREAM_MARKER: "times_2"}),)


def test_literal_lists_and_several_arguments_expand_as_a_cross_product() -> None:
    with _dag("cross_product") as dag:

        @task
        def numbers() -> list[int]:
            return [1, 2]

        @task
        def pair(letter: str, number: int, sep: str = "-") -> str:
            return f"{letter}{sep}{number}"

        pair.partial(sep=":").expand(letter=["a", "b"], number=numbers())
    spec = _spec(translate(dag))
    # in expand()'s order: the cross product's last argument varies fastest
    assert spec["pair"].expand == (
        ("letter", ["a", "b"]),
        ("number", {UPSTREAM_MARKER: "numbers"}),
    )
    assert spec["pair"].kwargs == {"sep": ":"}


def test_a_protected_task_maps_one_argument_over_one_upstream_list_only() -> None:
    with _dag("protected_literal") as dag:

        @task
        def charge(fence: Any, customer: str) -> None:
            return None

        charge.expand(customer=["acme", "globex"])
    refused(translate(dag), "charge", "expand", "map_key_field")


def test_mapped_classic_operators_run_each_item_through_execute() -> None:
    with _dag("mapped_operators") as dag:
        echo = BashOperator.partial(task_id="echo").expand(bash_command=["echo {{ ds }}", "x"])
        BashOperator(task_id="show", bash_command="echo $V", env={"V": echo.output})
    spec = _spec(translate(dag))
    assert spec["echo"].kind is TaskKind.EXECUTE
    assert spec["echo"].expand == (("bash_command", ["echo {{ ds }}", "x"]),)
    # a classic operator taking a mapped task's output gets its list (resolved by the worker)
    assert spec["show"].upstream == ("echo",)


def test_a_classic_operator_mapped_over_an_upstream_list_is_mapped() -> None:
    """The commonest form (``BashOperator.partial(...).expand(bash_command=upstream)``): one
    item per element of the upstream task's list, as Airflow maps it, never one unmapped task."""
    with _dag("mapped_operator_over_upstream") as dag:

        @task
        def commands() -> list[str]:
            return ["echo a", "echo b"]

        BashOperator.partial(task_id="over").expand(bash_command=commands())
    spec = _spec(translate(dag))
    assert spec["over"].kind is TaskKind.EXECUTE
    assert spec["over"].mapped
    assert spec["over"].expand == (("bash_command", {UPSTREAM_MARKER: "commands"}),)
    assert spec["over"].upstream == ("commands",)


def test_mapping_over_an_xcom_transform_or_a_dict_is_refused() -> None:
    with _dag("map_transform") as dag:

        @task
        def numbers() -> list[int]:
            return [1, 2]

        @task
        def show(x: int) -> int:
            return x

        show.expand(x=numbers().map(lambda n: n + 1))
        show.override(task_id="by_dict").expand(x={"a": 1})
    translation = translate(dag)
    refused(translation, "show", "expand", ".map()")
    refused(translation, "by_dict", "expand", "a dict")


def _spec(translation: Translation) -> dict[str, Any]:
    assert translation.ok, translation.report()
    assert translation.spec is not None
    return {t.task_id: t for t in translation.spec.tasks}


def test_a_consumer_of_a_mapped_tasks_results_takes_them_as_airflows_list() -> None:
    with _dag("reduce_mapped") as dag:

        @task
        def numbers() -> list[int]:
            return [1, 2, 3]

        @task
        def add_one(x: int) -> int:
            return x + 1

        @task
        def sum_it(values: list[int]) -> int:
            return sum(values)

        sum_it(add_one.expand(x=numbers()))
    translation = translate(dag)
    assert translation.ok, translation.report()
    assert translation.spec is not None
    tasks = {t.task_id: t for t in translation.spec.tasks}
    assert tasks["add_one"].map_over == "numbers"
    # the workflow hands the mapped task's result on as a list in map index order
    assert tasks["sum_it"].args == ({UPSTREAM_MARKER: "add_one"},)


def test_a_mapped_task_group_is_refused() -> None:
    with _dag("mapped_group") as dag:

        @task
        def values() -> list[int]:
            return [1, 2]

        @task_group
        def per_value(value: int) -> None:
            @task
            def double(v: int) -> int:
                return 2 * v

            double(value)

        per_value.expand(value=values())
    refused(translate(dag), "per_value.double", "mapped task group", "single tasks")


def test_expand_kwargs_maps_over_argument_dicts() -> None:
    def graph(dag_id: str, wired: bool) -> DAG:
        with _dag(dag_id) as dag:

            @task
            def pairs() -> list[dict[str, int]]:
                return [{"a": 1, "b": 2}]

            @task
            def add(a: int, b: int) -> int:
                return a + b

            if wired:  # an XComArg inside an argument dict is not resolved per item
                add.expand_kwargs([{"a": pairs(), "b": 1}])
            else:
                add.expand_kwargs(pairs())
                add.override(task_id="literal").expand_kwargs([{"a": 1, "b": 2}, {"a": 3}])
        return dag

    refused(translate(graph("expand_kwargs_wired", True)), "add", "expand_kwargs", "dicts")
    spec = _spec(translate(graph("expand_kwargs", False)))
    assert spec["add"].expand_kwargs == {UPSTREAM_MARKER: "pairs"}
    assert spec["literal"].expand_kwargs == [{"a": 1, "b": 2}, {"a": 3}]


# --- what Airflow does around a task ---------------------------------------------------------


def test_callbacks_and_depends_on_past_are_refused() -> None:
    with _dag("around") as dag:

        @task(on_failure_callback=lambda context: None)
        def alerting() -> None:
            pass

        @task(depends_on_past=True)
        def after_yesterday() -> None:
            pass

        alerting() >> after_yesterday()
    translation = translate(dag)
    refused(translation, "alerting", "callback", "on_failure_callback")
    refused(translation, "after_yesterday", "depends_on_past", "previous run")


def test_setup_and_teardown_translate_with_their_scope() -> None:
    """The flags, the teardown's rule and the indirect setups the workflow decides on (the
    truth check runs ``semantics_dags/setup_teardown.py`` in both engines)."""
    with _dag("scoped") as dag:

        @task
        def create_cluster() -> str:
            return "c1"

        @task
        def load(cluster: str) -> int:
            return 1

        @task(trigger_rule="all_done")
        def report(rows: int | None) -> None:
            pass

        @teardown(on_failure_fail_dagrun=True)
        def delete_cluster(cluster: str) -> None:
            pass

        @task
        def unscoped() -> None:
            pass

        cluster = create_cluster().as_setup()
        loaded = load(cluster)
        report(loaded) >> delete_cluster(cluster)
        loaded >> unscoped()
        BashOperator(task_id="bash_teardown", bash_command="true").as_teardown(setups=cluster)
    translation = translate(dag)
    assert translation.ok, translation.report()
    assert translation.spec is not None
    spec = {t.task_id: t for t in translation.spec.tasks}
    assert spec["create_cluster"].is_setup
    assert not spec["create_cluster"].is_teardown
    delete = spec["delete_cluster"]
    assert (delete.is_teardown, delete.on_failure_fail_dagrun) == (True, True)
    assert delete.trigger_rule == "all_done_setup_success"
    assert delete.setups == ()  # a teardown has no setup constraint
    bash = spec["bash_teardown"]
    assert (bash.kind, bash.is_teardown, bash.on_failure_fail_dagrun) == (
        TaskKind.EXECUTE,
        True,
        False,
    )
    # a direct setup is decided by the rule; only an indirect one is a setup constraint
    assert spec["load"].setups == ()
    assert spec["report"].setups == ("create_cluster",)
    # its setup's teardowns are not downstream of it: the setup is not relevant to it
    assert spec["unscoped"].setups == ()


def test_a_task_in_a_setup_scope_still_routes_alone() -> None:
    """Airflow runs it: the single-task spec keeps neither its upstreams nor its setups."""
    from bridge.graph import graph_problems
    from bridge.in_airflow.router import single_task_spec

    with _dag("scoped_alone") as dag:

        @setup
        def create() -> str:
            return "c1"

        @task
        def first() -> None:
            pass

        @task
        def second() -> None:
            pass

        @teardown
        def delete() -> None:
            pass

        made = create()
        made >> first() >> second() >> delete()
        made >> dag.task_dict["delete"]
    assert translate(dag).spec is not None
    assert translate(dag).spec.task("second").setups == ("create",)
    spec = single_task_spec(dag.task_dict["second"], {"dag": dag})
    assert [(t.task_id, t.upstream, t.setups) for t in spec.tasks] == [("second", (), ())]
    assert graph_problems(spec) == []


def test_a_mapped_setup_or_teardown_is_refused() -> None:
    with _dag("mapped_setup") as dag:

        @setup
        def clusters(n: int) -> str:
            return str(n)

        @task
        def work() -> None:
            pass

        clusters.expand(n=[1, 2]) >> work()
    refused(translate(dag), "clusters", "mapped setup/teardown", "each of its items")


def test_decide_mirrors_the_setup_rules_of_trigger_rule_dep() -> None:
    # all_done_setup_success: all done, and at least one direct setup succeeded
    rule = "all_done_setup_success"
    assert decide(rule, ["failed", "succeeded"], setups=["succeeded"]) == RUN
    assert decide(rule, ["upstream_failed", "failed"], setups=["failed"]) == UPSTREAM_FAILED
    assert decide(rule, ["skipped", "skipped"], setups=["skipped"]) == SKIPPED
    assert decide(rule, ["skipped", "failed"], setups=["skipped", "failed"]) == UPSTREAM_FAILED
    assert decide(rule, ["succeeded", "failed"], setups=["succeeded", "failed"]) == RUN
    assert decide(rule, ["failed", "skipped"]) == RUN  # no setup upstream: all_done
    # the setup constraint comes before the task's own rule, except for always
    assert decide("all_done", ["succeeded"], indirect_setups=["failed"]) == UPSTREAM_FAILED
    assert decide("all_done", ["failed"], indirect_setups=["upstream_failed"]) == UPSTREAM_FAILED
    assert decide("one_failed", ["failed"], indirect_setups=["skipped"]) == SKIPPED
    assert decide("always", ["failed"], indirect_setups=["failed"]) == RUN
    assert decide("all_success", ["succeeded"], indirect_setups=["succeeded"]) == RUN


def test_teardowns_do_not_decide_the_run_unless_they_fail_it() -> None:
    """Airflow's ``_tis_for_dagrun_state``: which tasks' states decide the run's."""
    setup_ = TaskSpec("setup", is_setup=True)
    work = TaskSpec("work", upstream=("setup",))
    down = TaskSpec("down", upstream=("setup", "work"), is_teardown=True)
    assert run_state_tasks(DagSpec("d", (setup_, work, down))) == {"work"}
    failing = dataclasses.replace(down, on_failure_fail_dagrun=True)
    assert run_state_tasks(DagSpec("d", (setup_, work, failing))) == {"down"}
    alone = TaskSpec("alone", is_teardown=True)
    assert run_state_tasks(DagSpec("d", (alone,))) == {"alone"}  # only teardowns: the leaves
    # an operator's upstream holds its ancestors: the run's leaves come from its direct ones
    bash = TaskSpec("bash", upstream=("setup", "work"), direct=("work",))
    assert run_state_tasks(DagSpec("d", (setup_, work, bash))) == {"bash"}


def test_templates_reading_what_the_worker_context_lacks_are_refused() -> None:
    with _dag("template_context") as dag:
        BashOperator(task_id="conf", bash_command="echo {{ dag_run.conf.get('message') }}")
        BashOperator(task_id="prev", bash_command="echo {{ prev_start_date_success }}")
        BashOperator(task_id="fine", bash_command="echo {{ ds }} {{ params.get('x') }}")
    translation = translate(dag)
    assert {u.task_id for u in translation.untranslatable} == {"prev"}, translation.report()
    refused(translation, "prev", "context variable", "prev_start_date_success")


def test_params_without_a_default_are_read_from_the_airflow_runs_conf() -> None:
    from airflow.sdk import Param

    with DAG(
        "required", schedule=None, start_date=START, params={"who": Param(type="string")}
    ) as dag:
        BashOperator(task_id="greet", bash_command="echo {{ params.who }}")
    translation = translate(dag)
    _runs_through_execute(translation, "greet")
    assert translation.spec is not None
    assert translation.spec.task("greet").reads_airflow_run == "params who without a default"


def test_a_template_reading_dag_run_conf_reads_the_airflow_run() -> None:
    """The handover carries the Airflow run's conf (test_airflow_run, test_corpus_truth)."""
    with _dag("template_conf") as dag:
        BashOperator(task_id="conf", bash_command="echo {{ dag_run.conf.get('message') }}")
        BashOperator(task_id="fine", bash_command="echo {{ ds }} {{ params.get('x') }}")
    translation = translate(dag)
    _runs_through_execute(translation, "conf", "fine")
    assert translation.spec is not None
    assert translation.spec.task("conf").reads_airflow_run == "dag_run.conf"
    assert translation.spec.task("fine").reads_airflow_run == ""


def test_the_worker_context_names_are_the_ones_the_worker_gives() -> None:
    with _dag("context_names"):
        op = BashOperator(task_id="t", bash_command="echo")
    run, ds = business_run("context_names", "r", "2024-01-02", period="day", timezone="UTC")
    assert set(template_context(op, run=run, try_number=1, upstream={}, ds=ds)) == WORKER_CONTEXT


# --- never crashes ---------------------------------------------------------------------------


class _Unreadable:
    """A callable whose signature cannot be read."""

    @property
    def __signature__(self) -> Any:
        raise RuntimeError("no signature here")

    def __call__(self) -> None:
        pass


class _BrokenDag:
    dag_id = "broken_dag"

    @property
    def tasks(self) -> list[Any]:
        raise KeyError("tasks went missing")


def test_a_task_or_dag_that_cannot_be_inspected_is_refused_not_raised() -> None:
    with _dag("uninspectable") as dag:
        PythonOperator(task_id="odd", python_callable=_Unreadable())
        BashOperator(task_id="ok", bash_command="echo")
    found = {t.dag_id: t for t in inventory([dag, _BrokenDag()])}
    refused(found["uninspectable"], "odd", "could not inspect", "RuntimeError: no signature here")
    broken = refused(found["broken_dag"], "(dag)", "could not inspect", "KeyError")
    assert broken.reason.startswith("could not inspect: ")


def test_cli_json_names_each_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "two.py").write_text(
        "import pendulum\n"
        "from airflow.sdk import DAG, task\n"
        "with DAG('two', schedule=None, start_date=pendulum.datetime(2024, 1, 1)):\n"
        "    @task\n"
        "    def a(inlet_events=None):\n"
        "        return 1\n"
        "    a()\n"
    )
    from bridge import cli
    from bridge.config import BridgeConfig

    args = cli.parser().parse_args(["--json", "inventory", "--dags-folder", str(tmp_path)])
    with contextlib.redirect_stderr(io.StringIO()):
        assert args.run(args, BridgeConfig.load()) == 1  # main() would os._exit the test run
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["dag_id"] == "two"
    assert lines[0]["translatable"] is False
    assert [(u["task_id"], u["construct"]) for u in lines[0]["untranslatable"]] == [
        ("a", "context argument")
    ]
    assert lines[-1] == {"dags": 1, "translatable": 0}


# --- what works stays translatable; the corpus -----------------------------------------------


def test_the_dags_the_bridge_runs_stay_translatable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "dags"))  # as the DAG folder is put on sys.path
    dags = {**dag_bag(REPO / "dags"), **dag_bag(REPO / "tests" / "bridge" / "airflow_dags")}
    found = {t.dag_id: t for t in inventory(dags.values())}
    for dag_id in ("bridge_whole_graph", "hourly_rollup", "model_deploy"):
        assert found[dag_id].ok, found[dag_id].report()
    for dag_id in ("bridge_billing", "billing_nightly"):
        # handed over from Airflow, their Jinja argument is rendered first: translatable then
        refused(found[dag_id], "charge", "Jinja argument", "{{ params.customers }}")
        rendered = translate(dags[dag_id], render=lambda value, _: value)
        assert rendered.ok, rendered.report()
    spec = translate(dags["bridge_whole_graph"]).spec
    assert spec is not None
    assert {t.kind for t in spec.tasks} == {TaskKind.PYTHON}
    # they read the context: the worker runs them through their operator with its context
    _runs_through_execute(found["tenant_webhooks"], "tenants")
    _runs_through_execute(found["soc2_nightly_backup"], "backup")
    _runs_through_execute(found["etl_daily"], "extract_features")
    _runs_through_execute(found["ml_training"], "train")


#: Corpus DAGs the handover's Airflow run makes translatable: LatestOnlyOperator, a template's
#: dag_run.conf, params without a default (the run's conf gives them).
CARRIED = (
    "latest_only",
    "latest_only_with_trigger",
    "example_trigger_target_dag",
    "example_params_ui_tutorial",
)
#: Corpus DAGs refused for one construct each, with the reason it stays refused.
STILL_REFUSED = {
    "tutorial_taskflow_templates": "Jinja argument",  # only Airflow renders a callable's
    "read_asset_event_from_classic": "context variable",  # triggering_asset_events
    "example_branch_dop_operator_v3": "depends_on_past",  # the previous run's task
    "example_retry_policy": "retry policy",  # decided per exception
    # its generator is carried; its asset is declared under another name elsewhere
    "asset_with_extra_by_yield": "asset conflict",
    # its post_execute hook is carried; its asset is declared under another name elsewhere
    "asset_with_extra_from_classic_operator": "asset conflict",
}


def test_every_example_dag_airflow_ships_is_reported_without_a_crash() -> None:
    dags = corpus_dags()
    assert len(dags) > 50
    found = inventory(dags.values())
    assert sorted(t.dag_id for t in found) == sorted(dags)
    by_construct: collections.Counter[str] = collections.Counter()
    for translation in found:
        assert translation.ok == (translation.spec is not None)
        json.dumps([u.__dict__ for u in translation.untranslatable])  # the JSON report
        for refusal in translation.untranslatable:
            assert all((refusal.task_id, refusal.construct, refusal.reason)), translation.report()
            by_construct[refusal.construct] += 1
    # an inspector bug shows here, not as a refusal nobody reads
    assert by_construct["could not inspect"] == 0, [t.report() for t in found if not t.ok]
    ok = sum(t.ok for t in found)
    by_id = {t.dag_id: t for t in found}
    # carried: the handover gives their tasks the Airflow run (its type, interval and conf)
    for dag_id in CARRIED:
        assert by_id[dag_id].ok, by_id[dag_id].report()
    # still refused, by name: what the worker does not run the same
    for dag_id, construct in STILL_REFUSED.items():
        constructs = {u.construct for u in by_id[dag_id].untranslatable}
        assert construct in constructs, by_id[dag_id].report()
    print(f"\ntranslatable: {ok}/{len(found)} ({ok / len(found):.0%})")
    for construct, count in by_construct.most_common():
        print(f"  {count:4d}  {construct}")


def test_a_rendered_protected_task_still_routes_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the router does in Airflow's task process (test_on_airflow runs it for real)."""
    import copy

    from bridge.in_airflow.router import single_task_spec

    monkeypatch.syspath_prepend(str(REPO / "dags"))
    dag = dag_bag(REPO / "tests" / "bridge" / "airflow_dags")["bridge_billing"]
    charge = copy.deepcopy(dag.task_dict["charge"])
    charge.op_kwargs = {"count": 30, "delay": 0.2, "writer": "manual__1"}  # as Airflow rendered
    spec = single_task_spec(charge, {"dag": dag})
    assert [(t.task_id, t.kind, t.fenced) for t in spec.tasks] == [
        ("charge", TaskKind.PYTHON, True)
    ]


def test_an_asset_another_dag_declares_under_another_name_is_refused() -> None:
    """Airflow keeps one of the two active and fails the tasks using the other (the example
    DAGs it ships do this: ``example_outlet_event_extra`` against ``example_inlet_event_extra``)."""
    from airflow.sdk import Asset

    with _dag("writes_named") as named:
        BashOperator(
            task_id="write", bash_command="true", outlets=[Asset(uri="s3://x/1", name="n")]
        )
    with _dag("writes_by_uri") as by_uri:
        BashOperator(task_id="write", bash_command="true", outlets=[Asset("s3://x/1")])
    with _dag("writes_other") as other:
        BashOperator(task_id="write", bash_command="true", outlets=[Asset("s3://x/2")])
    found = {t.dag_id: t for t in inventory([named, by_uri, other])}
    refused(found["writes_named"], "write", "asset conflict", "'s3://x/1'", "inactive")
    refused(found["writes_by_uri"], "write", "asset conflict", "'s3://x/1'")
    assert found["writes_other"].ok, found["writes_other"].report()
    assert translate(named).ok  # alone, nothing conflicts


def test_a_mapped_operators_templates_are_read_in_partial_and_literal_lists() -> None:
    with _dag("mapped_templates") as dag:
        lacking = "{{ prev_start_date_success }}"
        BashOperator.partial(task_id="partial", env={"X": lacking}).expand(bash_command=["x"])
        BashOperator.partial(task_id="listed").expand(bash_command=[f"echo {lacking}"])
        BashOperator.partial(task_id="sets").expand_kwargs([{"bash_command": lacking}])
        BashOperator.partial(task_id="fine").expand(bash_command=["echo {{ ds }}"])
    translation = translate(dag)
    for task_id in ("partial", "listed", "sets"):
        refused(translation, task_id, "context variable", "prev_start_date_success")
    assert "fine" not in {u.task_id for u in translation.untranslatable}
