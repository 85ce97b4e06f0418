"""The example-DAG corpus: the DAGs Airflow and its standard / common-sql providers ship, read in
place from the installed packages (never copied), and what the inventory says of each."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any


def corpus_folders() -> dict[str, Path]:
    """Bundle name -> the installed package folder of its example DAGs."""
    import airflow.example_dags
    import airflow.providers.common.sql.example_dags
    import airflow.providers.standard.example_dags

    return {
        "airflow_examples": Path(airflow.example_dags.__path__[0]),
        "standard_examples": Path(airflow.providers.standard.example_dags.__path__[0]),
        "sql_examples": Path(airflow.providers.common.sql.example_dags.__path__[0]),
    }


def dag_bag(folder: Path | str) -> dict[str, Any]:
    """The DAGs of ``folder``, parsed as a dag-processor parses (deprecations are no errors)."""
    from airflow.dag_processing.dagbag import DagBag

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bag = DagBag(str(folder), safe_mode=False)
    print(f"{folder}: {len(bag.dags)} DAGs, {len(bag.import_errors)} files that do not import")
    return dict(bag.dags)


def corpus_dags() -> dict[str, Any]:
    """Every DAG of the corpus, by DAG id."""
    dags: dict[str, Any] = {}
    for folder in corpus_folders().values():
        dags.update(dag_bag(folder))
    return dags
