"""Dynamic task mapping as the bridge carries it (this project's DAG; the corpus comparison runs
it in Airflow and through the bridge, XComs in map index order on both sides):

* a downstream task gets a mapped task's results as Airflow's list in map index order (the
  upstream list's order, not sorted by item; None results left out; a failed item's missing);
* ``expand()`` over a literal list, over several arguments (the cross product, the last
  argument varying fastest), with ``partial()``, and over a mapped task's list;
* ``expand_kwargs()`` over an upstream task's list of argument dicts and a literal one;
* a task mapped over an empty list, and an operator whose every item skips itself (bash's
  ``exit 99``): both skipped, and their ``all_success`` downstream too;
* mapped classic operators (``BashOperator.partial(...).expand(...)`` over a literal list and
  over an upstream task's list, a templated field, ``expand_kwargs``), and a classic operator
  taking a mapped task's output.

Every item has arguments of its own: the bridge refuses two items with the same arguments
(MIGRATION.md, "How a mapped task's activities are keyed"), where Airflow runs both.
"""

from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import BaseOperator, dag, task


class ScaleOperator(BaseOperator):
    """Multiplies its value by its factor (a classic operator mapped over both)."""

    def __init__(self, value: int, factor: int = 1, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.value = value
        self.factor = factor

    def execute(self, context: object) -> int:
        return self.value * self.factor


class TotalOperator(BaseOperator):
    """Sums a templated list (a mapped task's output, resolved to its list)."""

    template_fields = ("values",)

    def __init__(self, values: object, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.values = values

    def execute(self, context: object) -> int:
        return sum(self.values)  # type: ignore[call-overload]


@task
def commands() -> list[str]:
    """Commands for a classic operator mapped over this task's list."""
    return ["echo first", "echo second"]


@task
def nothing() -> list[str]:
    """An empty list: Airflow skips a task mapped over it, and its all_success downstream."""
    return []


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False)
def mapping_forms() -> None:
    @task
    def names() -> list[str]:
        return ["mo", "ann", "zedd", "b"]  # distinct lengths: 2, 3, 4, 1

    @task
    def greet(name: str) -> str | None:
        return None if name == "zedd" else f"hi {name}"  # None: Airflow pushes no XCom

    @task
    def shout(name: str) -> str:
        if name == "b":
            raise ValueError("b fails")
        return name.upper()

    @task
    def joined(greetings: list[str]) -> str:
        return ", ".join(greetings)

    @task(trigger_rule="all_done")
    def survivors(shouted: list[str]) -> list[str]:
        return list(shouted)

    @task
    def pair(letter: str, number: int, sep: str = "-") -> str:
        return f"{letter}{sep}{number}"

    @task
    def lengths(word: str) -> int:
        return len(word)

    @task
    def doubled(n: int) -> int:
        return 2 * n

    @task
    def listed(values: list[object]) -> list[object]:
        return list(values)

    @task
    def argument_sets() -> list[dict[str, object]]:
        return [{"letter": "z", "number": 9}, {"letter": "y", "number": 8, "sep": "+"}]

    people = names()
    joined(greet.expand(name=people))
    survivors(shout.expand(name=people))
    # a literal list and the cross product of a literal and an upstream list, with partial()
    listed.override(task_id="pairs")(
        pair.partial(sep=":").expand(letter=["b", "a"], number=lengths.expand(word=people))
    )
    # over a mapped task's list
    listed.override(task_id="doubles")(doubled.expand(n=lengths.expand(word=["xyz", "q"])))

    listed.override(task_id="kwargs_pairs")(pair.expand_kwargs(argument_sets()))
    listed.override(task_id="literal_kwargs")(
        pair.override(task_id="literal_pair").expand_kwargs([{"letter": "q", "number": 0}])
    )
    env = BashOperator.partial(task_id="env", do_xcom_push=True).expand_kwargs(
        [{"bash_command": "echo $X", "env": {"X": "ex"}}, {"bash_command": "echo {{ ds_nodash }}"}]
    )
    listed.override(task_id="envs")(env.output)

    bash = BashOperator.partial(task_id="echo", do_xcom_push=True).expand(
        bash_command=['echo "{{ ds }} one"', "echo two"]
    )
    scaled = ScaleOperator.partial(task_id="scale").expand(value=[3, 1, 2], factor=[10, 100])
    TotalOperator(task_id="total", values=scaled.output)
    listed.override(task_id="echoed")(bash.output)

    # the commonest form: a classic operator over one upstream task's list
    over = BashOperator.partial(task_id="echo_over", do_xcom_push=True).expand(
        bash_command=commands()
    )
    listed.override(task_id="echoed_over")(over.output)

    listed.override(task_id="after_nothing")(
        lengths.override(task_id="over_nothing").expand(word=nothing())
    )
    # every item skips itself (bash's exit 99)
    skips = BashOperator.partial(task_id="skip_each").expand(
        bash_command=["echo p; exit 99", "echo q; exit 99"]
    )
    listed.override(task_id="after_skips")(skips.output)


mapping_forms()
