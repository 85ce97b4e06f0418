"""The lease agent on the real store: a try's statements run on the agent's connections, the
database still decides, and every way the agent can fail leaves the try either connecting
itself (nothing was sent) or deferring as on a store outage (it may have run): never a lease
granted twice, never a lease lost.

Each test that kills or stops the agent runs it as its own process (``runlease agent``).
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from airflow_plugins.lease import Holder, LeaseStore, LeaseStoreUnavailable, agent, wire
from airflow_plugins.lease.agent import LeaseAgent
from tests.conftest import store_backends
from tests.lease.agent_process import RUNLEASE, AgentProcess, agent_backends
from tests.lease.ports import closed_port
from tests.lease.waiting import wait_for

DAY = date.today() - timedelta(days=1)  # inside the store's retention horizon


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "agent.sock"


@pytest.fixture
def agent_process(lease_db: str, socket_path: Path) -> Iterator[AgentProcess]:
    running = AgentProcess(lease_db, socket_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def agent_in_process(lease_db: str, socket_path: Path) -> Iterator[LeaseAgent]:
    served = LeaseAgent(lease_db, socket_path, workers=4)
    served.start()
    try:
        yield served
    finally:
        served.stop()


def _ask(path: Path, line: bytes) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(line)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(65536)
            assert chunk, "the agent closed the connection without answering"
            answer += chunk
    body: dict[str, object] = json.loads(answer)
    return body


def test_a_try_through_the_agent_opens_no_connection_of_its_own(
    lease_db: str, agent_process: AgentProcess
) -> None:
    key = f"billing_nightly/charge/{DAY}"
    with LeaseStore(lease_db, ttl=5.0, agent_socket=str(agent_process.path)) as store:
        assert store.warm_up()  # the agent's socket is there: nothing to warm, nothing asked
        first = Holder.process("first")
        got = store.acquire(key, first, business_date=DAY, input={"customers": 340})
        assert got.granted
        assert got.token == 1
        assert got.holder == first
        assert isinstance(got.expires_at, datetime)
        assert got.expires_at.tzinfo is not None

        held = store.acquire(key, Holder.process("second"))
        assert held.outcome == "held"
        assert held.holder == first
        assert held.token == 1

        assert store.renew(got.lease) > got.expires_at
        store.complete(got.lease, {"charged": 340, "at": "02:00"})
        again = store.acquire(key, Holder.process("third"))
        assert again.outcome == "succeeded"
        assert again.result == {"charged": 340, "at": "02:00"}

        # the try itself never connected: all of it ran on the agent's connections
        assert store_backends(lease_db) == []
        assert agent_backends(lease_db)
        # what the database recorded is what a direct try records
        row = store.get(key)
        assert row is not None
        assert row["state"] == "succeeded"
        assert row["business_date"] == DAY
        events = [(r["event"], r["outcome"]) for r in store.history(key)]
    assert events == [
        ("acquire", "granted"),
        ("acquire", "held"),
        ("complete", "succeeded"),
        ("acquire", "succeeded"),
    ]


def test_the_database_decides_with_and_without_the_agent_at_once(
    lease_db: str, agent_in_process: LeaseAgent, socket_path: Path
) -> None:
    keys = [f"race/{n}/{DAY}" for n in range(20)]
    granted: list[tuple[str, str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def contend(n: int) -> None:
        via_agent = n % 2 == 0
        holder = Holder.process(f"{'agent' if via_agent else 'direct'}-{n}")
        with LeaseStore(
            lease_db, ttl=30.0, agent_socket=str(socket_path) if via_agent else None
        ) as store:
            try:
                barrier.wait(timeout=30)
                for key in keys:
                    if store.acquire(key, holder).granted:
                        granted.append((key, holder.name or ""))
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    # one holder per key, whichever way each contender came
    assert sorted(k for k, _ in granted) == sorted(keys)
    assert agent_in_process.served >= len(keys)


def test_an_agent_killed_between_tries_costs_the_next_try_nothing(
    lease_db: str, agent_process: AgentProcess, socket_path: Path
) -> None:
    with LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as store:
        first = store.acquire(f"killed/first/{DAY}", Holder.process("before"))
        assert first.granted
        assert store_backends(lease_db) == []

        agent_process.signal(signal.SIGKILL)
        agent_process.proc.wait(timeout=30)
        assert stat.S_ISSOCK(socket_path.lstat().st_mode)  # the dead agent's socket is left

        # nobody listens: nothing was sent, so the try connects itself and is granted
        got = store.acquire(f"killed/second/{DAY}", Holder.process("after"))
        assert got.granted
        store.complete(got.lease, 2)
        assert store_backends(lease_db)

    # a new agent takes the dead one's socket over, and tries use it again
    restarted = AgentProcess(lease_db, socket_path)
    try:
        with LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as store:
            got = store.acquire(f"killed/third/{DAY}", Holder.process("restarted"))
            assert got.granted
            assert store.agent is not None
            assert store.agent.refused is None
    finally:
        restarted.stop()


def test_warm_up_asks_nothing_of_the_agent_and_warms_the_store_when_there_is_none(
    lease_db: str, agent_in_process: LeaseAgent, socket_path: Path, tmp_path: Path
) -> None:
    with LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as store:
        assert store.warm_up()
        assert agent_in_process.served + agent_in_process.failed == 0
        assert store_backends(lease_db) == []
    with LeaseStore(lease_db, ttl=5.0, agent_socket=str(tmp_path / "none.sock")) as store:
        assert store.warm_up()  # no agent here: the store's own connection is opened
        assert len(store_backends(lease_db)) == 1


def test_a_request_in_flight_when_the_agent_dies_is_an_outage_not_a_grant(
    lease_db: str, agent_process: AgentProcess, socket_path: Path
) -> None:
    key = f"in-flight/{DAY}"
    store = LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path))
    outcome: list[object] = []
    agent_process.signal(signal.SIGSTOP)  # it still accepts (the kernel queues the connection)

    def ask() -> None:
        try:
            outcome.append(store.acquire(key, Holder.process("in-flight")))
        except LeaseStoreUnavailable as exc:
            outcome.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        wait_for(lambda: socket_path.exists() and asking.is_alive(), timeout=10)
        threading.Event().wait(0.5)  # the request is written and waits for the stopped agent
        assert outcome == []
        agent_process.signal(signal.SIGKILL)
        asking.join(timeout=30)
        # the statement may have run, as with a dropped connection: the try defers, it does
        # not connect and ask again
        assert len(outcome) == 1
        assert isinstance(outcome[0], LeaseStoreUnavailable)
        assert "did not answer" in str(outcome[0])
        # this one never reached the database, so the key is free for the retry
        assert store.get(key) is None
        assert store.acquire(key, Holder.process("retry")).granted
    finally:
        store.close()


def test_an_agent_of_another_store_is_refused_and_the_try_connects_itself(
    lease_db: str, sink_db: str, socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = LeaseAgent(sink_db, socket_path)  # serves another database
    other.start()
    try:
        with (
            caplog.at_level(logging.WARNING),
            LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as store,
        ):
            got = store.acquire(f"other/{DAY}", Holder.process("mine"))
            assert got.granted
            assert store.get(f"other/{DAY}") is not None  # in this store, not the agent's
            assert store.agent is not None
            assert store.agent.refused is not None
            assert "this agent serves" in store.agent.refused
            assert store_backends(lease_db)
        assert other.served == 0
        assert any("refused this process" in r.getMessage() for r in caplog.records)
    finally:
        other.stop()


def test_a_store_down_behind_the_agent_is_an_outage(socket_path: Path) -> None:
    down = f"postgresql://postgres@127.0.0.1:{closed_port()}/leases"
    unreachable = LeaseAgent(down, socket_path, connect_timeout=1)
    unreachable.start()
    try:
        with LeaseStore(down, ttl=5.0, agent_socket=str(socket_path), connect_timeout=1) as store:
            with pytest.raises(LeaseStoreUnavailable, match="lease store unavailable"):
                store.acquire(f"down/{DAY}", Holder.process("waiting"))
            # answered, not refused: the agent is still the way to the store
            assert store.agent is not None
            assert store.agent.refused is None
        assert unreachable.failed == 1
    finally:
        unreachable.stop()


def test_the_agent_refuses_what_is_not_a_try_statement_and_keeps_serving(
    lease_db: str, agent_in_process: LeaseAgent, socket_path: Path
) -> None:
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
    store = agent_in_process.identity
    refused = [
        _ask(socket_path, b"not json\n"),
        _ask(socket_path, b'{"query": "acquire"}\n'),
        # an administrative statement is never relayed: it needs its actor's own connection
        _ask(
            socket_path,
            wire.request(store, "force_release", {"key": "k", "actor": "a", "reason": "r"}),
        ),
        _ask(socket_path, wire.request("someone@elsewhere:5432/db", "renew", {})),
        _ask(socket_path, b'{"store": "' + store.encode() + b'", "query": "renew", "params": 1}\n'),
    ]
    assert all(set(a) == {"refused"} for a in refused), refused
    assert agent_in_process.served == 0

    with LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as leases:
        assert leases.acquire(f"after-refusals/{DAY}", Holder.process("ok")).granted
    assert agent_in_process.served == 1
    # a parameter the store's API would not send is refused before it reaches the database
    answer = _ask(
        socket_path,
        wire.request(store, "renew", {"key": "k", "token": "not a number", "ttl_ms": 1000}),
    )
    assert "token must be an integer" in str(answer["refused"])
    # a well-formed renew of a lease nobody holds runs, and finds nothing
    answer = _ask(
        socket_path,
        wire.request(store, "renew", {"key": "k", "token": 7, "ttl_ms": 1000}),
    )
    assert answer == {"rows": []}


def test_connections_idle_through_a_server_restart_cost_no_request(
    lease_db: str, socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent, "IDLE_CHECK", 0.0)  # every connection counts as idle
    served = LeaseAgent(lease_db, socket_path, workers=1)
    served.start()
    try:
        with LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as store:
            assert store.acquire(f"restart/before/{DAY}", Holder.process("a")).granted
            # the server drops the agent's connection (a restart, a failover)
            with psycopg.connect(lease_db, autocommit=True) as conn:
                for pid in agent_backends(lease_db):
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_for(lambda: not agent_backends(lease_db))
            assert store.acquire(f"restart/after/{DAY}", Holder.process("b")).granted
        assert served.failed == 0
    finally:
        served.stop()


def _agent_command(dsn: str, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``runlease agent`` on ``path``, run to its end (a refusal, or ``--status``)."""
    return subprocess.run(
        [str(RUNLEASE), "--dsn", dsn, "agent", "--socket", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_agent_command_refuses_a_live_agents_socket_and_a_file(
    lease_db: str, agent_process: AgentProcess, socket_path: Path, tmp_path: Path
) -> None:
    second = _agent_command(lease_db, socket_path)
    assert second.returncode == 1
    assert "another lease agent answers" in second.stderr
    assert agent_process.proc.poll() is None  # the live one goes on

    plain = tmp_path / "not-a-socket"
    plain.write_text("keep me")
    refused = _agent_command(lease_db, plain)
    assert refused.returncode == 1
    assert "is not a socket" in refused.stderr
    assert plain.read_text() == "keep me"


def _status(dsn: str, path: Path) -> tuple[int, dict[str, object]]:
    done = _agent_command(dsn, path, "--status")
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_the_agent_reports_its_status_and_stops_on_sigterm_removing_its_socket(
    lease_db: str, agent_process: AgentProcess, socket_path: Path
) -> None:
    with LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as store:
        store.acquire(f"status/{DAY}", Holder.process("counted"))
    code, status = _status(lease_db, socket_path)
    assert code == 0
    assert status["served"] == 1
    assert status["failed"] == 0
    assert status["store"] == wire.store_identity(lease_db)

    agent_process.signal(signal.SIGTERM)
    assert agent_process.proc.wait(timeout=30) == 0
    assert not socket_path.exists()
    assert "stopping (1 served, 0 failed)" in agent_process.log.read_text()
    code, status = _status(lease_db, socket_path)
    assert code == 3  # unreachable, as every command says it
    assert status == {"socket": str(socket_path), "answers": False}


def test_a_request_that_fails_in_the_agent_is_an_outage_and_the_worker_goes_on(
    lease_db: str, socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_worker = LeaseAgent(lease_db, socket_path, workers=1)
    one_worker.start()
    real = wire.rows_answer
    failures = iter([RuntimeError("cannot encode the rows")])

    def encode_once_badly(rows: list[tuple[object, ...]]) -> bytes:
        for failure in failures:
            raise failure
        return real(rows)

    monkeypatch.setattr(wire, "rows_answer", encode_once_badly)
    try:
        with LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as store:
            # the statement ran, its answer was lost: the try must treat it as an outage
            with pytest.raises(LeaseStoreUnavailable, match="the lease agent failed"):
                store.acquire(f"agent-bug/{DAY}", Holder.process("first"))
            row = store.get(f"agent-bug/{DAY}")
            assert row is not None
            assert row["state"] == "running"
            # the one worker is still there and answers the next request
            assert store.acquire(f"agent-bug/next/{DAY}", Holder.process("second")).granted
        assert (one_worker.served, one_worker.failed) == (1, 1)
    finally:
        one_worker.stop()
