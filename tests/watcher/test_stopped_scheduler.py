"""The watcher finds the runs a stopped scheduler never made, on a real Airflow stack.

Both schedulers of the harness are stopped across more than three intervals of a per-minute,
opted-in DAG, while the watcher runs as its own command (``exactly-once-watcher run``) with a
45 s deadline and a 5 s poll. Every minute scheduled while they were down is paged (callback)
and counted (StatsD metric) after its deadline and within one poll plus slack; nothing is paged
for a minute that ran; the run still late (within its deadline) is not paged early.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_plugins.demo.stack import SCHEDULERS
from airflow_plugins.lease.keys import Period, business_period
from tests.harness.airflow_harness import AirflowHarness, wait_for
from tests.watcher.minutely import MinutelyDag, succeeded_periods, wait_for_runs

HEALTH_PORT = 29_420
STATSD_PORT = 29_430
POLL_S = 5
DEADLINE_S = 45
REPORT_SLACK = timedelta(seconds=POLL_S + 25)  # one poll, plus a look's own time under load


class StatsdListener:
    """Collects the StatsD datagrams the watcher sends (the metrics boundary)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.5)
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.lines.extend(data.decode(errors="replace").splitlines())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener(STATSD_PORT)
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture
def watcher_command(
    airflow: AirflowHarness, minutely_dag: MinutelyDag, tmp_path: Path, statsd: StatsdListener
) -> Iterator[Path]:
    """Starts ``exactly-once-watcher run`` against the harness; yields the pages file."""
    pages = tmp_path / "pages.jsonl"
    pages.touch()
    env = {
        **airflow.stack.env(),
        "AIRFLOW__EXACTLY_ONCE__WATCHER_POLL_SECONDS": str(POLL_S),
        "AIRFLOW__EXACTLY_ONCE__WATCHER_DEADLINES": f"{minutely_dag.dag_id}={DEADLINE_S}",
        "AIRFLOW__EXACTLY_ONCE__WATCHER_LOOKBACK_HOURS": "2",
        "AIRFLOW__EXACTLY_ONCE__WATCHER_HEALTH_PORT": str(HEALTH_PORT),
        "AIRFLOW__EXACTLY_ONCE__WATCHER_CALLBACK": "tests.watcher.paging:page",
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(STATSD_PORT),
        "WATCHER_TEST_PAGES": str(pages),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    log = tmp_path / "watcher.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_plugins.watcher.cli", "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: _health(HEALTH_PORT) == 200 or _dead(proc, log),
            timeout=120,
            what="the watcher's health check",
        )
        yield pages
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        print(log.read_text()[-3000:])


def _dead(proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"the watcher exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    return False


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)
    except OSError:
        return 0


def _pages(path: Path, dag_id: str) -> list[dict[str, str]]:
    """The pages for one DAG (the watcher also watches the session's other protected DAGs)."""
    pages = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [page for page in pages if page["dag_id"] == dag_id]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # includes starting the shared Airflow stack
def test_every_run_missed_while_the_schedulers_are_stopped_is_paged_once(
    airflow: AirflowHarness,
    minutely_dag: MinutelyDag,
    watcher_command: Path,
    statsd: StatsdListener,
) -> None:
    dag = minutely_dag
    wait_for_runs(airflow, dag, 1, timeout=300)
    schedulers = list(SCHEDULERS)
    stopped_at = datetime.now(UTC)
    for name in schedulers:
        airflow.stop_scheduler(name)
    try:
        # every minute that starts more than 5 s after the stop and before the restart is due
        # while no scheduler runs: wait for three of them plus their deadlines
        first_due = (stopped_at + timedelta(seconds=65)).replace(second=0, microsecond=0)
        due = [first_due + timedelta(minutes=i) for i in range(3)]
        # ... and past the last one's deadline and a poll, so all three are missed and paged
        # while no scheduler can run them
        while datetime.now(UTC) < due[-1] + timedelta(seconds=DEADLINE_S + POLL_S + 5):
            time.sleep(2)
        restarted_at = datetime.now(UTC)
    finally:
        for name in schedulers:
            airflow.start_scheduler(name, wait=False)
        airflow.ensure_schedulers()

    expected = {business_period(at, Period.MINUTE) for at in due}
    wait_for(
        lambda: expected <= {p["business_date"] for p in _pages(watcher_command, dag.dag_id)},
        timeout=DEADLINE_S + 120,
        what=f"pages for {sorted(expected)}",
        interval=2.0,
    )
    # let the stack run one more minute: a later look must not page anything again
    wait_for_runs(airflow, dag, len(succeeded_periods(airflow, dag)) + 1, timeout=240)
    time.sleep(POLL_S * 2)

    pages = _pages(watcher_command, dag.dag_id)
    paged = [p["business_date"] for p in pages]
    assert len(paged) == len(set(paged)), f"a run was paged twice: {paged}"
    # nothing is paged where there is no gap: a paged run either never succeeded or succeeded
    # only after its deadline (a restarted scheduler may still run one late)
    with airflow.lease_store() as store:
        for page in pages:
            lease = store.get(f"{dag.dag_id}/{dag.task_id}/{page['business_date']}")
            if lease is not None and lease["state"] == "succeeded":
                assert lease["finished_at"] > datetime.fromisoformat(page["deadline"]), page
    # every page is for a minute scheduled while the schedulers were down (or just around it)
    window_start = stopped_at - timedelta(minutes=1)
    for page in pages:
        scheduled = datetime.fromisoformat(page["scheduled_at"])
        assert window_start <= scheduled <= restarted_at, page
        deadline = datetime.fromisoformat(page["deadline"])
        paged_at = datetime.fromisoformat(page["paged_at"])
        # late (within its deadline) is not missed; missed is paged within one poll
        assert deadline <= paged_at <= deadline + REPORT_SLACK, page
    assert expected <= set(paged)
    # the metric went out for each page
    missed_metrics = [line for line in statsd.lines if "exactly_once.watcher.missed:" in line]
    assert len(missed_metrics) >= len(expected), statsd.lines[-20:]
    # runs done after the watcher started had their schedule lags exported (ms timings)
    lags = [line for line in statsd.lines if "exactly_once.schedule_lag.start:" in line]
    assert lags, statsd.lines[-20:]
    assert all(line.endswith("|ms") for line in lags)
    # the audit trail records each missed run once, by the watcher
    with airflow.lease_store() as store:
        for period in expected:
            rows = store.history(f"{dag.dag_id}/_dag_run/{period}")
            # (the listener's dag_run_* rows share the key when a run was made late)
            missed_rows = [(r["event"], r["actor"]) for r in rows if r["event"] == "missed_run"]
            assert missed_rows == [("missed_run", "watcher")]
    assert _health(HEALTH_PORT) == 200

    # the command lists the same gaps over the period (its last line: one JSON object)
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_plugins.watcher.cli",
            "gaps",
            "--dag",
            dag.dag_id,
            "--since",
            (stopped_at - timedelta(minutes=2)).isoformat(),
            "--until",
            restarted_at.isoformat(),
        ],
        env={
            **airflow.stack.env(),
            "AIRFLOW__EXACTLY_ONCE__WATCHER_DEADLINES": f"{dag.dag_id}={DEADLINE_S}",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = listed.stdout.strip().splitlines()
    counts = json.loads(lines[-1])
    missed_lines = {line.split()[2] for line in lines[:-1] if line.startswith("missed")}
    # a minute a restarted scheduler ran late is done now, not a gap any more
    with airflow.lease_store() as store:
        ran_late = {
            period
            for period in expected
            if (row := store.get(f"{dag.dag_id}/{dag.task_id}/{period}")) is not None
            and row["state"] == "succeeded"
        }
    assert expected - ran_late <= missed_lines
    assert not ran_late & missed_lines
    assert counts["missed"] == len(missed_lines)
