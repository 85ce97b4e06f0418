"""Named SQL blocks: read once, when the book is made, never on a try's path."""

from __future__ import annotations

import os
from importlib import resources

import pytest

from airflow_plugins.lease import queries
from airflow_plugins.lease.queries import QueryBook


def test_a_forked_process_reads_no_file_for_a_query() -> None:
    # a task process is a fork of its executor's worker, which imported the plugin: the
    # blocks it needs are already in memory there
    book = QueryBook("airflow_plugins.lease", "sql/queries.sql")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: any file read now would raise
        os.close(read)
        ok = b"0"
        try:
            resources.files = _no_files  # type: ignore[assignment]
            ok = b"1" if "runlease.lease" in book("acquire") else b"0"
        finally:
            os.write(write, ok)
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_a_missing_file_or_block_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError):
        QueryBook("airflow_plugins.lease", "sql/no-such-file.sql")
    with pytest.raises(KeyError, match=r"no_such_block.*airflow_plugins\.lease/sql/queries\.sql"):
        queries.query("no_such_block")


def _no_files(package: str) -> object:
    raise AssertionError(f"a query read {package}'s files after import")
