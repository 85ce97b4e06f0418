"""The watcher's /health reveals nothing to whoever can reach it, and listens on the loopback.

A look that fails with an error naming the store's host, user and password leaves the endpoint
answering 503 "stale" without that text; by default it is bound to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from datetime import datetime

import pytest

from airflow_plugins.lease import LeaseStore
from airflow_plugins.watcher.gaps import WatchedDag
from airflow_plugins.watcher.service import Watcher, serve_health

INTERNAL = "connection to postgresql://watcher_user:pw-9@10.1.2.3:5432/leases failed"


def test_a_failed_look_is_not_told_to_the_health_endpoint(lease_db: str) -> None:
    stop = threading.Event()

    def dags(now: datetime) -> list[WatchedDag]:
        stop.set()
        raise RuntimeError(INTERNAL)  # the metadata database read fails

    with LeaseStore(lease_db) as store:
        watcher = Watcher(store, dags, emit_metrics=False)
        watcher.run_forever(0.01, stop)
        server = serve_health(watcher, poll=5.0, port=29_411)
        try:
            assert server.server_address[0] == "127.0.0.1"
            with pytest.raises(urllib.error.HTTPError) as stale:
                urllib.request.urlopen("http://127.0.0.1:29411/health", timeout=10)
            body = stale.value.read().decode()
            stale.value.close()
        finally:
            server.shutdown()
            server.server_close()
    assert stale.value.code == 503
    assert json.loads(body) == {"status": "stale", "last_ok": None}
    for internal in ("watcher_user", "10.1.2.3", "pw-9", "5432"):
        assert internal not in body
