"""A real Airflow api-server with the plugin, on a fresh metadata database, for the views tests.

One server per test session (it takes tens of seconds to migrate and start on a small machine).
Users come from Airflow's SimpleAuthManager: ``admin`` (admin role) and ``viewer`` (viewer role),
so the tests log in exactly as a person does; ``restricted`` (viewer) may read one DAG only,
through a SimpleAuthManager subclass with per-DAG grants (tests/views/grants.py). The plugin
is loaded from a plugins folder that
imports ``airflow_plugins.protection.plugin`` (the entry point loads the same class when installed;
Airflow registers a plugin name once).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_plugins.lease import LEASE_STORE, migrate
from tests.conftest import create_database, drop_database

# Airflow's API server imports starlette's test client (through svcs), which warns about httpx
# at import; the suite turns warnings into errors, so import it once here with that one ignored.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    import airflow.api_fastapi.app

VENV_BIN = Path(sys.executable).parent
API_PORT = 29_180
USERS = {
    "admin": ("admin", "admin-pw-1"),
    "viewer": ("viewer", "viewer-pw-1"),
    "restricted": ("restricted", "restricted-pw-1"),
}
OPTED_IN_DAG = textwrap.dedent(
    """
    from datetime import datetime
    from airflow.sdk import DAG, task

    with DAG(
        "compliance_minutely",
        schedule="* * * * *",
        start_date=datetime(2024, 1, 1),
        catchup=False,
        tags=["exactly-once"],
    ):
        @task
        def backup():
            return "ok"

        backup()
    """
)
# the shadow gate's DAGs: the page refuses shadow for one (its task 'notify' has an effect
# nobody rolls back), accepts it for the other (declared side-effect-free)
GATE_DAGS = textwrap.dedent(
    """
    from datetime import datetime
    from airflow.providers.standard.operators.bash import BashOperator
    from airflow.sdk import DAG, task

    for dag_id, tags in (
        ("gate_refused", ["side-effect-free:extract"]),
        ("admin_change", ["side-effect-free"]),
    ):
        with DAG(dag_id, schedule=None, start_date=datetime(2024, 1, 1), tags=tags):

            @task
            def extract():
                return [1, 2]

            extract() >> BashOperator(task_id="notify", bash_command="echo sent")
    """
)
# the page's temporal-scheduled change: a DAG with a cron that translates
SCHEDULED_DAG = textwrap.dedent(
    """
    from datetime import datetime
    from airflow.sdk import DAG, task

    with DAG(
        "page_scheduled", schedule="0 2 * * *", start_date=datetime(2024, 1, 1), catchup=False
    ):

        @task
        def total():
            return 1

        total()
    """
)
PLUGIN = textwrap.dedent(
    """
    from airflow_plugins.protection.plugin import ExactlyOncePlugin  # noqa: F401
    """
)


@dataclasses.dataclass(frozen=True)
class AirflowApi:
    """A running api-server: its URL, its environment and the lease store's DSN."""

    url: str
    env: dict[str, str]
    lease_dsn: str
    home: Path

    def token(self, user: str) -> str:
        """A JWT for ``user`` from the auth manager's token endpoint (as the UI's login does)."""
        name, password = USERS[user]
        request = urllib.request.Request(
            f"{self.url}/auth/token",
            data=json.dumps({"username": name, "password": password}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            token: str = json.loads(answer.read())["access_token"]
            return token


def _airflow(env: dict[str, str], *args: str, timeout: float = 600) -> None:
    done = subprocess.run(
        [str(VENV_BIN / "airflow"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def _wait_http(url: str, deadline: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"api-server exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    raise RuntimeError(f"api-server did not answer in time:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def airflow_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowApi]:
    """Migrates a fresh metadata database and starts ``airflow api-server`` with the plugin."""
    home = tmp_path_factory.mktemp("airflow_home")
    (home / "dags").mkdir()
    (home / "plugins").mkdir()
    (home / "dags" / "compliance_minutely.py").write_text(OPTED_IN_DAG)
    (home / "dags" / "gate_dags.py").write_text(GATE_DAGS)
    (home / "dags" / "page_scheduled.py").write_text(SCHEDULED_DAG)
    (home / "plugins" / "exactly_once_views.py").write_text(PLUGIN)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({name: pw for name, pw in USERS.values()}))
    meta_dsn = create_database("eoafmeta")
    lease_dsn = create_database("eoaflease")
    migrate(lease_dsn, LEASE_STORE)
    from bridge.cutover import migrate_bridge

    migrate_bridge(lease_dsn)
    meta = psycopg.conninfo.conninfo_to_dict(meta_dsn)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer,restricted:viewer",
        # per-DAG grants: 'restricted' may read compliance_minutely only (tests/views/grants.py)
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.views.grants.GrantingAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
            f"postgresql+psycopg2://{meta.get('user', 'postgres')}@{meta.get('host', '127.0.0.1')}:"
            f"{meta.get('port', '5432')}/{meta['dbname']}"
        ),
        "AIRFLOW__API_AUTH__JWT_SECRET": "views-test-secret-not-for-production",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{API_PORT}",
        "AIRFLOW__EXACTLY_ONCE__LEASE_DSN": lease_dsn,
        # no Temporal for the pages: a change into temporal-scheduled cannot make its Schedule
        "BRIDGE_TEMPORAL_ADDR": "127.0.0.1:1",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    log = home / "api-server.log"
    proc = None
    try:
        _airflow(env, "db", "migrate")
        _airflow(env, "dags", "reserialize")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(VENV_BIN / "airflow"),
                    "api-server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(API_PORT),
                    "--workers",
                    "1",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{API_PORT}"
        _wait_http(f"{url}/api/v2/monitor/health", time.monotonic() + 240, proc, log)
        yield AirflowApi(url=url, env=env, lease_dsn=lease_dsn, home=home)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        drop_database(meta_dsn)
        drop_database(lease_dsn)


# The browser test runs on the shared real-Airflow harness (schedulers, dag-processor, ...),
# with the bridge's scenario DAGs and the session's Temporal dev server (a handed-over run).
from tests.bridge.conftest import SCENARIO_DAGS, TEMPORAL_PORT, temporal_address  # noqa: E402
from tests.harness.airflow_harness import EXTRA_DAG_FOLDERS, EXTRA_ENV  # noqa: E402
from tests.harness.fixtures import airflow  # noqa: E402
from tests.watcher.minutely import minutely_dag  # noqa: E402

EXTRA_DAG_FOLDERS["bridge"] = SCENARIO_DAGS
# the scenario DAGs default to port 27233; every component (and the pages) gets the session's
EXTRA_ENV.setdefault("BRIDGE_TEMPORAL_ADDR", f"127.0.0.1:{TEMPORAL_PORT}")

__all__ = ["AirflowApi", "airflow", "airflow_api", "minutely_dag", "temporal_address"]
