"""Who gets what from the pages, on a real api-server with the plugin mounted.

Every route refuses a request without Airflow's JWT (401); a viewer reads the pages but cannot
change a cutover mode, force-release a lease or approve a re-run (403, nothing changed); an
admin can, and the change is audited with the admin as actor.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import httpx
import pytest

from airflow_plugins.lease import Holder, LeaseStore
from airflow_plugins.views.app import router
from tests.views.conftest import AirflowApi

PREFIX = "/exactly-once"


def _routes() -> list[tuple[str, str]]:
    found = []
    for route in router.routes:
        for method in sorted(getattr(route, "methods", ()) or ()):
            if method != "HEAD":
                found.append((method, route.path))  # type: ignore[attr-defined]
    return found


ROUTES = _routes()
FORMS: dict[str, dict[str, str]] = {
    "/leases/force-release": {"key": "billing_nightly/charge/2024-02-15", "reason": "test"},
    "/leases/approve-rerun": {"key": "billing_nightly/charge/2024-02-15", "reason": "test"},
    "/migration/mode": {"dag_id": "billing_nightly", "mode": "shadow", "reason": "test"},
}
QUERIES = {
    "/api/audit": {"dag_id": "billing_nightly", "business_date": "2024-02-15"},
    "/handover": {"dag_id": "compliance_minutely", "run_id": "manual__never_handed_over"},
}


def _call(api: AirflowApi, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    url = f"{api.url}{PREFIX}{path}"
    with httpx.Client(timeout=60, follow_redirects=False) as client:
        if method == "POST":
            return client.post(url, data=FORMS[path], headers=headers)
        return client.get(url, params=QUERIES.get(path, {}), headers=headers)


def test_the_router_has_every_page_and_change() -> None:
    assert {p for _, p in ROUTES} >= {
        "/",
        "/leases",
        "/audit",
        "/api/audit",
        "/runs",
        "/migration",
        "/leases/force-release",
        "/leases/approve-rerun",
        "/migration/mode",
        "/handover",
    }


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_endpoint_refuses_an_unauthenticated_request(
    airflow_api: AirflowApi, method: str, path: str
) -> None:
    assert _call(airflow_api, method, path, {}).status_code == 401
    # a forged token is refused too (Airflow answers 403 "Invalid JWT token" for those)
    for forged in ({"Authorization": "Bearer not-a-token"}, {"Cookie": "_token=not-a-token"}):
        answer = _call(airflow_api, method, path, forged)
        assert answer.status_code in (401, 403), answer.text
        assert "<html" not in answer.text


def _auth(api: AirflowApi, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token(user)}", "Origin": api.url}


def _mode(api: AirflowApi, dag_id: str) -> str:
    from bridge.cutover import ModeStore

    with LeaseStore(api.lease_dsn) as store:
        return ModeStore(store).get(dag_id).value


def test_a_viewer_reads_every_page_but_changes_nothing(airflow_api: AirflowApi) -> None:
    headers = {"Authorization": f"Bearer {airflow_api.token('viewer')}"}
    for method, path in ROUTES:
        if method == "GET":
            answer = _call(airflow_api, method, path, headers)
            assert answer.status_code in (200, 307), (path, answer.text[:500])

    with LeaseStore(airflow_api.lease_dsn) as store:
        holder = Holder.process("views-test")
        running = store.acquire("viewer_guard/charge/2024-02-15", holder, ttl=600).lease
        done = store.acquire("viewer_guard/charge/2024-02-14", holder, ttl=600).lease
        store.complete(done, {"charged": 1})
        tries: list[tuple[str, dict[str, Any]]] = [
            ("/migration/mode", {"dag_id": "viewer_guard", "mode": "shadow", "reason": "r"}),
            ("/leases/force-release", {"key": running.key, "reason": "r"}),
            ("/leases/approve-rerun", {"key": done.key, "reason": "r"}),
        ]
        with httpx.Client(timeout=60) as client:
            for path, form in tries:
                answer = client.post(f"{airflow_api.url}{PREFIX}{path}", data=form, headers=headers)
                assert answer.status_code == 403, (path, answer.text)
        assert _mode(airflow_api, "viewer_guard") == "airflow"
        lease = store.get(running.key)
        assert lease is not None
        assert lease["state"] == "running"
        assert lease["token"] == running.token
        succeeded = store.get(done.key)
        assert succeeded is not None
        assert not succeeded["rerun_approved"]


def test_an_admin_changes_a_mode_and_the_change_is_audited(airflow_api: AirflowApi) -> None:
    headers = _auth(airflow_api, "admin")
    form = {"dag_id": "admin_change", "mode": "shadow", "reason": "start the dual run"}
    with httpx.Client(timeout=60) as client:
        answer = client.post(
            f"{airflow_api.url}{PREFIX}/migration/mode", data=form, headers=headers
        )
    assert answer.status_code == 303, answer.text
    assert "airflow+-%3E+shadow" in answer.headers["location"] or "shadow" in urllib.parse.unquote(
        answer.headers["location"]
    )
    assert _mode(airflow_api, "admin_change") == "shadow"
    with LeaseStore(airflow_api.lease_dsn) as store:
        rows = store.history("admin_change/cutover")
    assert [(r["actor"], r["reason"]) for r in rows] == [("admin", "start the dual run")]


def test_the_page_refuses_shadow_naming_the_tasks_the_gate_refuses(
    airflow_api: AirflowApi,
) -> None:
    """The same gate as `bridge mode set DAG shadow`: the tasks named, the mode unchanged."""
    form = {"dag_id": "gate_refused", "mode": "shadow", "reason": "start the dual run"}
    url = f"{airflow_api.url}{PREFIX}/migration/mode"
    with httpx.Client(timeout=120) as client:
        # auth and per-DAG permissions come first: a viewer is refused before any gate
        viewer = {"Authorization": f"Bearer {airflow_api.token('viewer')}"}
        assert client.post(url, data=form, headers=viewer).status_code == 403
        answer = client.post(url, data=form, headers=_auth(airflow_api, "admin"))
    assert answer.status_code == 409, answer.text
    assert answer.json()["detail"] == (
        "gate_refused: shadow refused, Temporal would run these tasks with effects: notify: "
        "writes outside a fence (tag the DAG side-effect-free:notify if it has no effect, or "
        "make it a protected task with a sink)"
    )
    assert _mode(airflow_api, "gate_refused") == "airflow"
    with LeaseStore(airflow_api.lease_dsn) as store:
        assert store.history("gate_refused/cutover") == []


def test_the_page_enters_temporal_scheduled_as_the_command_line_does(
    airflow_api: AirflowApi,
) -> None:
    """Into temporal-scheduled the page runs `bridge mode set` (in a child process): the
    Temporal Schedule is made first, so with Temporal unreachable nothing changes and the page
    says so, without the child's hosts (before, the page only wrote the mode)."""
    from bridge.cutover import ModeStore

    with LeaseStore(airflow_api.lease_dsn) as store:
        for mode in ("shadow", "temporal"):
            ModeStore(store).set("page_scheduled", mode, actor="ops", reason="setup", force=True)
    form = {"dag_id": "page_scheduled", "mode": "temporal-scheduled", "reason": "schedule it"}
    url = f"{airflow_api.url}{PREFIX}/migration/mode"
    with httpx.Client(timeout=180) as client:
        answer = client.post(url, data=form, headers=_auth(airflow_api, "admin"))
    assert answer.status_code == 409, answer.text
    detail = answer.json()["detail"]
    assert detail == (
        "Temporal or the lease store did not answer (details in the api-server's log) "
        "(page_scheduled is in mode temporal)"
    )
    assert _mode(airflow_api, "page_scheduled") == "temporal"
    with LeaseStore(airflow_api.lease_dsn) as store:
        rows = store.history("page_scheduled/cutover")
    assert [(r["actor"], r["output"]["to"]) for r in rows] == [
        ("ops", "shadow"),
        ("ops", "temporal"),
    ]


def test_a_change_posted_from_another_site_is_refused(airflow_api: AirflowApi) -> None:
    headers = {**_auth(airflow_api, "admin"), "Origin": "https://evil.example"}
    form = {"dag_id": "cross_site", "mode": "shadow", "reason": "csrf"}
    with httpx.Client(timeout=60) as client:
        answer = client.post(
            f"{airflow_api.url}{PREFIX}/migration/mode", data=form, headers=headers
        )
    assert answer.status_code == 403
    assert _mode(airflow_api, "cross_site") == "airflow"


def test_a_viewer_restricted_to_one_dag_sees_only_that_dag(airflow_api: AirflowApi) -> None:
    from bridge.cutover import ModeStore

    day = "2031-05-04"
    with LeaseStore(airflow_api.lease_dsn) as store:
        holder = Holder.process("grants-test")
        for dag_id in ("compliance_minutely", "hidden_billing"):
            lease = store.acquire(f"{dag_id}/charge/{day}", holder, ttl=600).lease
            store.complete(lease, {"dag": dag_id})
        ModeStore(store).set("hidden_billing", "shadow", actor="grants-test", reason="seed")
    restricted = {"Authorization": f"Bearer {airflow_api.token('restricted')}"}
    viewer = {"Authorization": f"Bearer {airflow_api.token('viewer')}"}
    with httpx.Client(timeout=60) as client:

        def get(path: str, headers: dict[str, str], **params: str) -> httpx.Response:
            return client.get(f"{airflow_api.url}{PREFIX}{path}", params=params, headers=headers)

        # the unrestricted viewer sees both DAGs: the seed is there to be hidden
        assert "hidden_billing/charge" in get("/leases", viewer).text
        assert "hidden_billing" in get("/migration", viewer).text

        leases = get("/leases", restricted)
        assert leases.status_code == 200
        assert f"compliance_minutely/charge/{day}" in leases.text
        assert "hidden_billing" not in leases.text
        assert "hidden_billing" not in get("/migration", restricted).text
        assert "hidden_billing" not in get("/runs", restricted).text
        # a DAG run that handed nothing to Temporal says so (no Temporal read at all)
        run = get("/handover", restricted, dag_id="compliance_minutely", run_id="manual__1")
        assert run.status_code == 200
        assert "Nothing of this DAG run was handed to Temporal" in run.text
        mine = get("/api/audit", restricted, dag_id="compliance_minutely", business_date=day)
        assert mine.status_code == 200
        assert [k["key"] for k in mine.json()["keys"]] == [f"compliance_minutely/charge/{day}"]
        for path, params in (
            ("/api/audit", {"dag_id": "hidden_billing", "business_date": day}),
            ("/audit", {"dag_id": "hidden_billing", "business_date": day}),
            ("/runs", {"dag_id": "hidden_billing"}),
            ("/handover", {"dag_id": "hidden_billing", "run_id": "manual__1"}),
        ):
            answer = get(path, restricted, **params)
            assert answer.status_code == 403, (path, answer.text[:300])
            assert "hidden_billing/charge" not in answer.text
