"""The metadata database of the demo's and the tests' Airflow ends a session left idle in a
transaction, so a scheduler killed alone, whose surviving executor workers still hold its
socket, cannot keep DAG-run rows locked from the other scheduler."""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest

from airflow_plugins.demo.deployment import guard_metadata_database
from tests.conftest import ADMIN_DSN


def test_a_dead_schedulers_open_transaction_stops_blocking_the_other_one(empty_db: str) -> None:
    guard_metadata_database(ADMIN_DSN, empty_db, timeout="1s")
    with psycopg.connect(empty_db, autocommit=True) as setup:
        setup.execute("CREATE TABLE dag_run (id int PRIMARY KEY, state text)")
        setup.execute("INSERT INTO dag_run VALUES (1, 'running')")

    # the "scheduler": a child process that locks the run in a transaction and is SIGKILLed,
    # while the "worker" (this process) still holds the inherited socket
    dead = psycopg.connect(empty_db)
    dead.execute("SELECT * FROM dag_run WHERE id = 1 FOR UPDATE")
    pid = os.fork()
    if pid == 0:  # the scheduler: it stays in its transaction until it is killed
        time.sleep(60)
        os._exit(0)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)

    with psycopg.connect(empty_db, autocommit=True) as other:
        locked = other.execute("SELECT id FROM dag_run FOR UPDATE SKIP LOCKED").fetchall()
        assert locked == []  # still held: the socket is open in this process
        deadline = time.monotonic() + 30
        while not locked and time.monotonic() < deadline:
            time.sleep(0.2)
            locked = other.execute("SELECT id FROM dag_run FOR UPDATE SKIP LOCKED").fetchall()
        assert locked == [(1,)]  # the server ended the idle transaction after 1 s
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
        dead.execute("SELECT 1")
    dead.close()
