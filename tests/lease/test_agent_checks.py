"""The lease agent lets a request do no more than the store's Python API would: forged requests
over its socket (a 23-day TTL, a horizon of 100000 days, an unmasked 2 MB input, a finish of
another holder's lease) are refused or bounded as the API bounds them; a client that drips its
request is dropped; and a client checks who owns the socket before it trusts an answer.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import psycopg
import pytest

from airflow_plugins.lease import Holder, LeaseLost, LeaseStore, agent, wire
from airflow_plugins.lease.agent import LeaseAgent
from tests.conftest import store_backends

DAY = date.today() - timedelta(days=1)


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "agent.sock"


@pytest.fixture
def served(lease_db: str, socket_path: Path) -> Iterator[LeaseAgent]:
    running = LeaseAgent(lease_db, socket_path, workers=2)
    running.start()
    try:
        yield running
    finally:
        running.stop()


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


def _acquire_params(key: str, holder: Holder, **changes: object) -> dict[str, object]:
    params: dict[str, object] = {
        "key": key,
        "holder": holder.json_text,
        "ttl_ms": 5000,
        "business_date": DAY,
        "horizon_days": 400,
        "input": None,
    }
    params.update(changes)
    return params


def _rows(dsn: str, sql: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def test_a_forged_acquire_gets_no_more_than_the_stores_api_allows(
    lease_db: str, served: LeaseAgent, socket_path: Path
) -> None:
    forger = Holder.process("forger")
    store = served.identity
    # a 23-day TTL (the store allows 7) and a date far past the horizon, each refused
    long = _ask(
        socket_path,
        wire.request(
            store, "acquire", _acquire_params("forged/ttl", forger, ttl_ms=23 * 86400 * 1000)
        ),
    )
    old_day = date.today() - timedelta(days=5000)
    past = _ask(
        socket_path,
        wire.request(
            store,
            "acquire_decided",
            _acquire_params("forged/old", forger, business_date=old_day, horizon_days=100000),
        ),
    )
    batch = _ask(
        socket_path,
        wire.request(
            store,
            "acquire_batch",
            {
                "keys": ["forged/b1"],
                "holder": forger.json_text,
                "ttl_ms": 5000,
                "business_date": old_day,
                "horizon_days": 100000,
            },
        ),
    )
    assert "refused" in long, long
    assert "7 days" in str(long["refused"])
    assert "refused" in past, past
    assert "horizon" in str(past["refused"])
    assert "refused" in batch, batch
    assert _rows(lease_db, "SELECT key FROM runlease.lease") == []

    # an unmasked 2 MB input is recorded as the API records it: masked, bounded
    secret = "hunter2-" + "x" * 16
    raw = json.dumps({"password": secret, "blob": "y" * (2 * 1024 * 1024)})
    answer = _ask(
        socket_path,
        wire.request(store, "acquire", _acquire_params(f"forged/input/{DAY}", forger, input=raw)),
    )
    assert "rows" in answer, answer
    ((recorded,),) = _rows(
        lease_db, "SELECT input::text FROM runlease.audit WHERE key = %s", f"forged/input/{DAY}"
    )
    assert secret not in str(recorded)
    assert len(str(recorded)) < 20_000
    assert json.loads(str(recorded))["_truncated"] is True


def test_a_forged_finish_of_another_holders_lease_changes_nothing(
    lease_db: str, served: LeaseAgent, socket_path: Path
) -> None:
    key = f"billing_nightly/charge/{DAY}"
    owner = Holder.process("owner")
    with LeaseStore(lease_db, ttl=30.0) as direct:
        lease = direct.acquire(key, owner, business_date=DAY).lease
    store = served.identity
    finish = {
        "key": key,
        "token": lease.token,
        "state": "succeeded",
        "result": json.dumps({"charged": 0}),
        "output": None,
        "error": None,
    }
    # by key and token alone, or naming a holder of its own: the lease is not the forger's
    bare = _ask(socket_path, wire.request(store, "finish", finish))
    forger = Holder.process("forger")
    own = _ask(socket_path, wire.request(store, "finish", {**finish, "holder": forger.json_text}))
    # naming the owner, from another process than the owner's
    line = wire.request(store, "finish", {**finish, "holder": owner.json_text})
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])\n"
        "s.sendall(sys.stdin.buffer.read()); out = b''\n"
        "while not out.endswith(b'\\n'):\n"
        "    c = s.recv(65536)\n"
        "    if not c: break\n"
        "    out += c\n"
        "sys.stdout.buffer.write(out)\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", script, str(socket_path)],
        input=line,
        capture_output=True,
        check=True,
        timeout=30,
    )
    impersonated = json.loads(other.stdout)
    for answer in (bare, own, impersonated):
        assert answer.get("rows") in (None, []), answer
    assert "refused" in bare
    assert "refused" in impersonated
    assert "pid" in str(impersonated["refused"])

    ((state,),) = _rows(lease_db, "SELECT state FROM runlease.lease WHERE key = %s", key)
    assert state == "running"
    events = _rows(lease_db, "SELECT event FROM runlease.audit WHERE key = %s", key)
    assert events == [("acquire",)]

    # the owner itself still finishes through the agent, audited under its own name
    with LeaseStore(lease_db, ttl=30.0, agent_socket=str(socket_path)) as via_agent:
        via_agent.complete(lease, {"charged": 340})
        with pytest.raises(LeaseLost):
            via_agent.complete(
                type(lease)(key, lease.token, lease.attempt, forger, lease.ttl, lease.expires_at),
                {"charged": 0},
            )
    ((holder, result),) = _rows(
        lease_db,
        "SELECT holder, output FROM runlease.audit WHERE key = %s AND event = 'complete'",
        key,
    )
    assert holder == owner.to_json()
    assert result == {"charged": 340}


def test_a_client_that_drips_its_request_is_dropped_and_the_worker_serves_others(
    lease_db: str, socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent, "CLIENT_TIMEOUT", 1.0)
    running = LeaseAgent(lease_db, socket_path, workers=1)
    running.start()
    try:
        line = wire.request(
            running.identity, "acquire", _acquire_params(f"drip/{DAY}", Holder.process("drip"))
        )
        sent = 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
            slow.connect(str(socket_path))
            slow.settimeout(0.5)
            dropped = False
            # 15 bytes at one each 0.3 s: longer than the bound, far from the whole line
            for byte in line[:15]:
                try:
                    slow.sendall(bytes([byte]))
                    sent += 1
                    if slow.recv(1) == b"":
                        dropped = True
                        break
                except TimeoutError:
                    continue
                except OSError:
                    dropped = True
                    break
                time.sleep(0.3)
        assert dropped, "the agent kept a dripping client for its whole request"
        # its only worker is free again
        with LeaseStore(lease_db, ttl=5.0, agent_socket=str(socket_path)) as store:
            assert store.acquire(f"after-drip/{DAY}", Holder.process("next")).granted
        assert running.served == 1
    finally:
        running.stop()


_FAKE_AGENT = """
import json, os, socket, sys
path = sys.argv[1]
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(8)
print("ready", flush=True)
row = [["v", "granted"], ["v", 999], ["v", 1], ["v", None], ["t", "2099-01-01T00:00:00+00:00"],
       ["v", None], ["v", None], ["v", None], ["v", None], ["v", True]]
while True:
    c, _ = s.accept()
    c.recv(65536)
    c.sendall(json.dumps({"rows": [row]}).encode() + b"\\n")
    c.close()
"""


@pytest.mark.skipif(os.getuid() != 0, reason="starting an agent as another user needs root")
def test_a_client_does_not_trust_a_socket_owned_by_another_user(lease_db: str) -> None:
    room = Path(tempfile.mkdtemp(prefix="eo-impostor-", dir="/tmp"))
    os.chown(room, 65534, 65534)
    path = room / "agent.sock"
    impostor = subprocess.Popen(
        [sys.executable, "-c", _FAKE_AGENT, str(path)], stdout=subprocess.PIPE, text=True
    )
    key = f"impostor/{DAY}"
    try:
        assert impostor.stdout is not None
        assert impostor.stdout.readline().strip() == "ready"
        with LeaseStore(lease_db, ttl=5.0, agent_socket=str(path)) as store:
            got = store.acquire(key, Holder.process("try"), business_date=DAY)
            # the answer came from the store itself, not from the impostor's forged grant
            assert got.granted
            assert got.token == 1
            assert store_backends(lease_db)  # the try connected itself
            assert store.agent is not None
            assert "uid" in str(store.agent.refused)
        ((state, token),) = _rows(
            lease_db, "SELECT state, token FROM runlease.lease WHERE key = %s", key
        )
        assert (state, token) == ("running", 1)
    finally:
        impostor.kill()
        impostor.wait()
        if impostor.stdout is not None:
            impostor.stdout.close()
        shutil.rmtree(room, ignore_errors=True)
