"""The pages against hostile requests and hostile data, in process on a real lease store.

The app runs under FastAPI's test client with Airflow's SimpleAuthManager deciding who is an
admin (the login itself is the real api-server's, covered by test_access): secrets in a lease's
result and a failed try's error are masked on /leases and /audit while the stored result stays
faithful; oversized ranges, empty and out-of-range parameters get a 4xx; a lease store that is
down gives a 503 that does not name its host, port or user; a change with a forged origin is
refused.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_plugins.lease import LEASE_STORE, Holder, LeaseStore, migrate
from airflow_plugins.lease.keys import Period
from airflow_plugins.watcher.gaps import WatchedDag

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api.security import get_user

from airflow_plugins.views.app import create_app
from tests.conftest import create_database, drop_database

BASE = "http://airflow.example:8080"
SECRET = "Hunter2-pw/with@chars"
DAY = "2024-02-15"


class Minutely:
    """A DAG scheduled every minute, lazily (a year of it is half a million runs)."""

    def runs_between(self, start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
        at = start.replace(second=0, microsecond=0)
        while at <= end:
            yield at, at
            at += timedelta(minutes=1)


@pytest.fixture(scope="module")
def stores() -> Iterator[list[LeaseStore]]:
    """The lease stores the apps opened, closed at the end."""
    opened: list[LeaseStore] = []
    yield opened
    for store in opened:
        store.close()


@pytest.fixture(scope="module")
def seeded(stores: list[LeaseStore]) -> Iterator[str]:
    """One lease store for the module: a succeeded lease whose result holds secrets and a
    failed try with a DSN in its error."""
    dsn = create_database("eoviews")
    migrate(dsn, LEASE_STORE)
    try:
        with LeaseStore(dsn) as store:
            holder = Holder.process("hostile-test")
            done = store.acquire(f"secretive/charge/{DAY}", holder, ttl=600).lease
            store.complete(
                done, {"api_key": SECRET, "conn": f"postgresql://u:{SECRET}@db/x", "charged": 3}
            )
            failed = store.acquire(f"secretive/refund/{DAY}", holder, ttl=600).lease
            store.fail(
                failed, f"OperationalError: connection to postgresql://app:{SECRET}@db:5432 failed"
            )
        yield dsn
    finally:
        for store in stores:
            store.close()
        stores.clear()
        drop_database(dsn)


def _client(stores: list[LeaseStore], lease_dsn: str, role: str = "viewer") -> TestClient:
    def store() -> LeaseStore:
        opened = LeaseStore(lease_dsn, connect_timeout=1.0)
        stores.append(opened)
        return opened

    dag = WatchedDag(
        "minutely_dag", Minutely(), Period.MINUTE, start=datetime(2000, 1, 1, tzinfo=UTC)
    )
    app = create_app(store=store, dags=lambda now: [dag])
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username=role, role=role)
    create_auth_manager()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
        return TestClient(app, base_url=BASE, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def viewer(stores: list[LeaseStore], seeded: str) -> TestClient:
    """A viewer's client of the seeded store."""
    return _client(stores, seeded)


def test_secrets_in_results_and_errors_are_masked_on_the_pages(viewer: TestClient) -> None:
    client = viewer
    for path, params in (
        ("/leases", {}),
        ("/audit", {"dag_id": "secretive", "business_date": DAY}),
        ("/api/audit", {"dag_id": "secretive", "business_date": DAY}),
    ):
        answer = client.get(path, params=params)
        assert answer.status_code == 200, (path, answer.text[:300])
        assert SECRET not in answer.text, path
        assert "Hunter2" not in answer.text, path
    page = client.get("/leases").text
    assert "charged" in page  # the rest of the result is shown
    assert "OperationalError" in page


def test_the_stored_result_stays_faithful_and_the_audit_is_masked(seeded: str) -> None:
    with LeaseStore(seeded) as store:
        again = store.acquire(f"secretive/charge/{DAY}", Holder.process("later run"), ttl=600)
        assert again.result == {
            "api_key": SECRET,
            "conn": f"postgresql://u:{SECRET}@db/x",
            "charged": 3,
        }
        failed = store.get(f"secretive/refund/{DAY}")
        rows = store.history(f"secretive/refund/{DAY}") + store.history(f"secretive/charge/{DAY}")
    assert failed is not None
    assert SECRET not in str(failed["error"])
    assert "postgresql://app:***@db:5432" in str(failed["error"])
    assert rows
    assert all(SECRET not in str(r) for r in rows)


# (request, the answers it may get)
OUT_OF_RANGE: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
    ("/runs", {"until": "0001-01-01"}, (400,)),
    ("/runs", {"since": "0001-01-01", "until": "0001-01-02"}, (400,)),
    ("/runs", {"until": "9999-12-31T23:59"}, (400,)),
    ("/runs", {"since": "2024-01-01", "until": "2025-06-01"}, (400,)),  # over 400 days
    ("/runs", {"since": "2024-02-02", "until": "2024-02-01"}, (400,)),
    ("/runs", {"since": "not a date"}, (400,)),
    ("/api/audit", {"dag_id": "secretive", "business_date": ""}, (422,)),
    ("/api/audit", {"dag_id": "secretive", "business_date": "~"}, (422,)),
    ("/api/audit", {"dag_id": "secretive", "business_date": "%"}, (422,)),
    ("/api/audit", {"dag_id": "", "business_date": DAY}, (422,)),
    ("/api/audit", {"dag_id": "secretive", "business_date": DAY, "limit": "1000000"}, (422,)),
    ("/audit", {"dag_id": "secretive", "business_date": DAY, "limit": "1000000"}, (422,)),
    ("/leases", {"limit": "100000"}, (422,)),
    ("/leases", {"hours": "100000"}, (422,)),
    ("/migration", {"days": "100000"}, (422,)),
]


@pytest.mark.parametrize(("path", "params", "codes"), OUT_OF_RANGE)
def test_out_of_range_requests_get_a_clear_4xx(
    viewer: TestClient, path: str, params: dict[str, Any], codes: tuple[int, ...]
) -> None:
    answer = viewer.get(path, params=params)
    assert answer.status_code in codes, answer.text[:300]
    assert "Traceback" not in answer.text


def test_an_empty_business_date_on_the_page_shows_nothing(viewer: TestClient) -> None:
    page = viewer.get("/audit", params={"dag_id": "secretive", "business_date": ""})
    assert page.status_code == 200
    assert "refund" not in page.text


def test_a_year_of_a_minutely_dag_is_one_bounded_page(viewer: TestClient) -> None:
    answer = viewer.get("/runs", params={"since": "2023-03-01T00:00", "until": "2024-03-01T00:00"})
    assert answer.status_code == 200
    assert len(answer.content) < 5_000_000
    assert 'id="more"' in answer.text  # the next page is offered, from the first run not shown
    assert "2023-03-02T09:20" in answer.text  # 2000 minutes after the start


def test_a_store_that_is_down_does_not_reveal_where_it_is(stores: list[LeaseStore]) -> None:
    client = _client(stores, "postgresql://secret_user:pw1@127.0.0.1:1/leases?connect_timeout=1")
    answer = client.get("/leases")
    assert answer.status_code == 503
    for internal in ("secret_user", "127.0.0.1", "port", "pw1", ":1"):
        assert internal not in answer.text, answer.text


# (headers of a change posted by an admin, whether it is let through)
ORIGINS: list[tuple[str, dict[str, str], bool]] = [
    ("same origin", {"Origin": BASE}, True),
    ("same origin, default port spelled", {"Origin": "http://airflow.example:8080/"}, True),
    ("other site", {"Origin": "https://evil.example"}, False),
    ("other scheme", {"Origin": "https://airflow.example:8080"}, False),
    ("other port", {"Origin": "http://airflow.example:9090"}, False),
    ("null origin", {"Origin": "null"}, False),
    ("host header only", {"Origin": "airflow.example:8080"}, False),
    ("no origin, cross-site referer", {"Referer": "https://evil.example/page"}, False),
    ("no origin, own referer", {"Referer": f"{BASE}/exactly-once/leases"}, True),
    ("neither, cookie session", {}, False),
    ("neither, bearer client", {"Authorization": "Bearer api-client"}, True),
]


@pytest.mark.parametrize(
    ("headers", "allowed"), [o[1:] for o in ORIGINS], ids=[o[0] for o in ORIGINS]
)
def test_a_change_is_let_through_only_from_airflows_own_origin(
    stores: list[LeaseStore],
    seeded: str,
    monkeypatch: pytest.MonkeyPatch,
    headers: dict[str, str],
    allowed: bool,
) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", BASE)
    with LeaseStore(seeded) as store:
        lease = store.acquire(
            f"origin_dag/charge/{uuid.uuid4().hex}", Holder.process("o"), ttl=600
        ).lease
        client = _client(stores, seeded, role="admin")
        answer = client.post(
            "/leases/force-release",
            data={"key": lease.key, "reason": "test"},
            headers=headers,
            follow_redirects=False,
        )
        state = (store.get(lease.key) or {})["state"]
    assert (answer.status_code == 303) is allowed, answer.text
    assert state == ("released" if allowed else "running")
