"""The pages in a real headless Chromium, on the real Airflow stack of the harness.

A person logs in through Airflow's login form, then opens each page: the leases page shows the
lease of a real protected billing run and the duplicate run that was blocked; the audit page
answers "ran exactly once" for it with its token and holder; the runs page shows a per-minute
opted-in DAG's schedule lag and its SLA; the migration page shows a DAG in shadow mode with its
compared runs, a divergence and a comparison still waiting (and why); a DAG run whose driver
handed it to Temporal has a "Temporal tasks" tab on Airflow's DAG run page, and its page shows
each task's state from the workflow.
Every chart is an SVG that renders with marks in it; any browser console error fails the test.
A screenshot of each page, on a desktop and on a phone-sized screen, is saved under
``test-artifacts/views/``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.harness.airflow_harness import AirflowHarness
from tests.watcher.minutely import MinutelyDag, wait_for_runs

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "views"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
    "--disable-extensions",
]
DEMO_DAG = "views_shadow_demo"


def _seed_migration(airflow: AirflowHarness) -> None:
    """A DAG in shadow mode with compared runs (one diverging), through the bridge's store."""
    from bridge.comparison import CompareInput, ComparisonRow, compare_run, store_comparison
    from bridge.cutover import ModeStore, migrate_bridge
    from bridge.spec import DagRunResult, DagSpec, RunMode, TaskOutcome, TaskSpec

    migrate_bridge(airflow.lease_dsn)
    with airflow.lease_store() as store:
        modes = ModeStore(store)
        if modes.get(DEMO_DAG).value == "airflow":
            modes.set(DEMO_DAG, "shadow", actor="views-test", reason="start the dual run")
        for day in range(6):
            matched = day != 2
            store_comparison(
                store,
                ComparisonRow(
                    dag_id=DEMO_DAG,
                    business_date=(date(2024, 2, 10) + timedelta(days=day)).isoformat(),
                    primary_status="succeeded",
                    primary_ms=4000 + 300 * day,
                    shadow_status="succeeded",
                    shadow_ms=3600 + 250 * day,
                    differences=[] if matched else [{"task": "charge", "what": "result digest"}],
                    primary_digests={"charge": "a1"},
                    primary_items={"charge": ["c1", "c2"]},
                    shadow_digests={"charge": "a1" if matched else "b2"},
                    shadow_items={"charge": ["c1", "c2"]},
                ),
            )
        # a seventh shadow finished before its primary: its comparison waits, saying why
        spec = DagSpec(DEMO_DAG, tasks=(TaskSpec(task_id="charge", callable_ref="m:f"),))
        outcome = {"charge": TaskOutcome("succeeded")}
        shadow = DagRunResult(DEMO_DAG, "2024-02-16", RunMode.SHADOW, "success", outcome)
        assert compare_run(store, CompareInput(spec, shadow)).pending


@pytest.fixture(scope="module")
def handed_over_run(
    airflow: AirflowHarness, temporal_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """A real DAG run whose driver handed the graph to Temporal (the bridge's scenario DAG
    ``bridge_whole``), run by a real worker process."""
    from bridge.cutover import ModeStore, migrate_bridge
    from tests.bridge.conftest import scenario_worker

    migrate_bridge(airflow.lease_dsn)
    with airflow.lease_store() as store:
        modes = ModeStore(store)
        if modes.get("bridge_whole_graph").value != "temporal":
            modes.set("bridge_whole_graph", "temporal", actor="views", reason="e2e", force=True)
    folder = tmp_path_factory.mktemp("views-bridge-worker")
    with scenario_worker(temporal_address, airflow.lease_dsn, airflow.sink_dsn, folder):
        day = airflow.fresh_business_date()
        run_id = airflow.trigger_dag_run("bridge_whole", {"business_date": day})
        ended = airflow.wait_for_run_state("bridge_whole", run_id, timeout=300)
        assert ended["state"] == "success", (folder / "worker.log").read_text()[-3000:]
        yield {"run_id": run_id, "day": day}


@pytest.fixture(scope="module")
def protected_run(airflow: AirflowHarness) -> dict[str, Any]:
    """A real protected billing run and a second run of the same date that was blocked."""
    day = airflow.fresh_business_date()
    conf = {"business_date": day, "customers": 12, "charge_delay": 0.05}
    first = airflow.trigger_dag_run("billing_nightly", conf)
    ended = airflow.wait_for_run_state("billing_nightly", first, timeout=300)
    assert ended["state"] == "success", airflow.client().task_instances("billing_nightly", first)
    duplicate = airflow.trigger_dag_run("billing_nightly", conf)
    airflow.wait_for_run_state("billing_nightly", duplicate, timeout=300)
    with airflow.lease_store() as store:
        lease = store.get(f"billing_nightly/charge/{day}")
    assert lease is not None
    assert lease["state"] == "succeeded"
    return {"day": day, "key": f"billing_nightly/charge/{day}", "token": lease["token"]}


class Browser:
    """A logged-in Chromium page that records console errors."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.page = page
        self.base_url = base_url
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: str) -> Any:
        self.errors.clear()
        answer = self.page.goto(f"{self.base_url}/exactly-once{path}", wait_until="load")
        assert answer is not None
        assert answer.status == 200, self.page.content()[:500]
        return self.page

    def charts_render(self, minimum: int) -> None:
        charts = self.page.locator("svg.chart")
        assert charts.count() >= minimum
        for i in range(charts.count()):
            box = charts.nth(i).bounding_box()
            assert box is not None
            assert box["height"] > 40
            assert box["width"] > 200

    def marks(self) -> int:
        count: int = self.page.locator("svg.chart rect, svg.chart circle").count()
        return count


def _login(page: Any, base_url: str, user: str, password: str) -> None:
    page.goto(f"{base_url}/", wait_until="load")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=60_000)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # includes starting the shared Airflow stack
def test_each_page_in_a_real_browser(
    airflow: AirflowHarness,
    protected_run: dict[str, Any],
    minutely_dag: MinutelyDag,
    handed_over_run: dict[str, str],
) -> None:
    from playwright.sync_api import sync_playwright

    _seed_migration(airflow)
    wait_for_runs(airflow, minutely_dag, 2, timeout=360)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    day, key = protected_run["day"], protected_run["key"]
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = chromium.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            _login(page, airflow.base_url, *airflow.admin)
            browser = Browser(page, airflow.base_url)

            page = browser.open(f"/leases?prefix=billing_nightly/charge/{day}")
            assert key in page.locator("#leases").inner_text()
            blocked = page.locator("#blocked").inner_text()
            assert key in blocked
            assert "succeeded" in blocked  # the duplicate run was told: already done
            browser.charts_render(1)
            assert browser.marks() >= 2  # granted and blocked bars
            page.screenshot(path=str(ARTIFACTS / "leases.png"), full_page=True)
            assert browser.errors == []

            page = browser.open(f"/audit?dag_id=billing_nightly&business_date={day}")
            assert "ran exactly once" in page.locator("#verdict").inner_text()
            tries = page.locator("table.tries").first.inner_text()
            assert str(protected_run["token"]) in tries
            assert "billing_nightly.charge" in tries
            # the second run of the date was blocked: counted on its key
            assert re.search(r"\b[1-9]\d* blocked duplicates?\b", page.inner_text("main"))
            browser.charts_render(1)
            assert browser.marks() >= 1
            page.screenshot(path=str(ARTIFACTS / "audit.png"), full_page=True)
            assert browser.errors == []

            # runs scheduled before Airflow first saw the DAG are not expected (catchup from
            # when it was first seen): on a slow dag-processor the first runs may not count,
            # so wait for the per-minute DAG's later runs to be measured
            deadline = time.monotonic() + 300
            while True:
                page = browser.open(f"/runs?dag_id={minutely_dag.dag_id}")
                assert "p95 start lag" in page.locator("#sla").inner_text()
                measured = page.locator("#sla .card").nth(2).locator("b").inner_text()
                if int(measured) >= 2 or time.monotonic() > deadline:
                    break
                time.sleep(10)
            assert int(measured) >= 2
            browser.charts_render(1)
            assert browser.marks() >= 2
            page.screenshot(path=str(ARTIFACTS / "runs.png"), full_page=True)
            assert browser.errors == []

            page = browser.open("/migration")
            modes = page.locator("#modes").inner_text()
            assert DEMO_DAG in modes
            assert "shadow" in modes
            section = page.locator(f"#dag-{DEMO_DAG}")
            assert "diverged" in section.inner_text()
            waiting = section.locator("table.waiting").inner_text()
            assert "2024-02-16" in waiting
            assert "the primary has not finished charge" in waiting
            assert section.locator("svg.chart circle").count() >= 12  # both engines, 6 runs
            browser.charts_render(2)
            page.screenshot(path=str(ARTIFACTS / "migration.png"), full_page=True)
            assert browser.errors == []

            # the handed-over run's tab on Airflow's own DAG run page, then its tasks
            run_id = handed_over_run["run_id"]
            page.goto(f"{airflow.base_url}/dags/bridge_whole/runs/{run_id}", wait_until="load")
            tab = page.get_by_role("link", name="Temporal tasks")
            tab.first.wait_for(timeout=60_000)
            handover = f"/handover?dag_id=bridge_whole&run_id={quote(run_id)}"
            page = browser.open(handover)
            workflow = f"dagrun:bridge_whole_graph/dagrun/{handed_over_run['day']}"
            section = page.locator("section.workflow")
            assert section.count() == 1
            assert workflow in section.inner_text()
            assert "completed" in section.locator("h2").inner_text()
            states = {
                row.get_attribute("data-task"): row.locator("td").nth(1).inner_text()
                for row in section.locator("tr[data-task]").all()
            }
            assert states == {"extract": "succeeded", "charge": "succeeded", "report": "succeeded"}
            page.screenshot(path=str(ARTIFACTS / "handover.png"), full_page=True)
            assert browser.errors == []

            phone = chromium.new_context(
                viewport={"width": 390, "height": 844},
                is_mobile=True,
                storage_state=context.storage_state(),
            )
            small = Browser(phone.new_page(), airflow.base_url)
            for name, path in (
                ("leases", "/leases"),
                ("audit", f"/audit?dag_id=billing_nightly&business_date={day}"),
                ("runs", f"/runs?dag_id={minutely_dag.dag_id}"),
                ("migration", "/migration"),
            ):
                page = small.open(path)
                # nothing wider than the screen but the tables' own scrolling boxes
                overflow = page.evaluate(
                    "document.documentElement.scrollWidth - document.documentElement.clientWidth"
                )
                assert overflow <= 2, (name, overflow)
                small.charts_render(1)
                page.screenshot(path=str(ARTIFACTS / f"{name}-phone.png"), full_page=True)
                assert small.errors == []
        finally:
            chromium.close()
    for name in ("leases", "audit", "runs", "migration"):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000
        assert (ARTIFACTS / f"{name}-phone.png").stat().st_size > 5_000
