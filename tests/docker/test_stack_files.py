"""The docker/ stack: its files parse and name what a production-shaped stack needs.

No Docker engine runs here, so this checks the files themselves: the compose file is valid YAML
with every component, each long-running one with a healthcheck; startup waits on health; the two
schedulers do not share ports; Temporal keeps its own persistence (not the dev server); the
commands the stack runs exist in this repository; the Dockerfile builds from Airflow 3.3 and
installs the package.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
LONG_RUNNING = (
    "postgres",
    "temporal",
    "redis",
    "airflow-apiserver",
    "airflow-scheduler-1",
    "airflow-scheduler-2",
    "airflow-dag-processor",
    "airflow-triggerer",
    "bridge-worker",
    "watcher",
    "lease-agent",
    "airflow-worker-1",
    "airflow-worker-2",
)
# services started from the stack's own image (the Airflow ones): they wait for airflow-init
AIRFLOW_IMAGE = LONG_RUNNING[3:]
WORKERS = ("airflow-worker-1", "airflow-worker-2")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    return loaded


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return command if isinstance(command, list) else [command]


def test_every_component_is_there_with_a_healthcheck(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in LONG_RUNNING:
        assert name in services, name
        check = services[name].get("healthcheck")
        assert check is not None, f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert len(" ".join(check["test"][1:])) > 5, name


def test_airflow_components_run_the_right_commands(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert _command(services["airflow-apiserver"])[:2] == ["airflow", "api-server"]
    assert _command(services["airflow-scheduler-1"]) == ["airflow", "scheduler"]
    assert _command(services["airflow-scheduler-2"]) == ["airflow", "scheduler"]
    assert _command(services["airflow-dag-processor"]) == ["airflow", "dag-processor"]
    assert _command(services["airflow-triggerer"]) == ["airflow", "triggerer"]


def test_the_python_entry_points_the_stack_runs_exist() -> None:
    text = (DOCKER / "docker-compose.yml").read_text()
    modules = set(re.findall(r'"-m", "([\w.]+)"', text))
    assert modules >= {"bridge.worker", "airflow_plugins.watcher.cli"}
    for module in modules:
        found = importlib.util.find_spec(module)
        assert found is not None, module
        if found.submodule_search_locations:  # a package runs as its __main__ module
            found = importlib.util.find_spec(f"{module}.__main__")
            assert found is not None, module
        assert found.origin is not None, module
        assert "main(" in Path(found.origin).read_text(), module
    assert "migrate_bridge" in text
    from bridge.cutover import migrate_bridge

    assert callable(migrate_bridge)


def test_startup_waits_on_health_and_schedulers_do_not_share_ports(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    for name in AIRFLOW_IMAGE:
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy", name
        assert depends["airflow-init"]["condition"] == "service_completed_successfully", name
    assert services["bridge-worker"]["depends_on"]["temporal"]["condition"] == "service_healthy"
    ports = {
        name: (
            services[name]["environment"]["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"],
            services[name]["environment"]["AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT"],
        )
        for name in ("airflow-scheduler-1", "airflow-scheduler-2")
    }
    log_ports = {p[0] for p in ports.values()}
    health_ports = {p[1] for p in ports.values()}
    assert len(log_ports) == 2
    assert len(health_ports) == 2


def test_temporal_has_its_own_persistence(compose: dict[str, Any]) -> None:
    temporal = compose["services"]["temporal"]
    assert "start-dev" not in " ".join(_command(temporal))
    assert temporal["environment"]["DB"].startswith("postgres")
    assert temporal["environment"]["DBNAME"] == "temporal"
    init = (DOCKER / "postgres-init.sh").read_text()
    for database in ("airflow", "leases", "billing", "temporal", "temporal_visibility"):
        assert f"CREATE DATABASE {database} OWNER" in init
    assert "ALTER DATABASE airflow SET idle_in_transaction_session_timeout" in init


def test_every_service_reaches_the_lease_store_and_metrics(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in AIRFLOW_IMAGE:
        env = services[name]["environment"]
        assert env["AIRFLOW_CONN_EXACTLY_ONCE_LEASES"].endswith("/leases"), name
        assert env["AIRFLOW__METRICS__STATSD_ON"] == "True", name
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name


def test_celery_workers_on_redis_with_the_result_backend_on_postgres(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    names = set()
    for name in WORKERS:
        command = _command(services[name])
        assert command[:3] == ["airflow", "celery", "worker"], name
        names.add(command[command.index("--celery-hostname") + 1])
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert "inspect ping" in " ".join(services[name]["healthcheck"]["test"]), name
    assert len(names) == len(WORKERS), "two workers with the same Celery node name"
    env = services["airflow-worker-1"]["environment"]
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://:")
    assert env["AIRFLOW__CELERY__BROKER_URL"].endswith("@redis:6379/0")
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://airflow:")
    assert env["AIRFLOW__CELERY__TASK_ACKS_LATE"] == "True"
    # the lease TTL is far below the visibility timeout: takeovers decide, not re-deliveries
    visibility = int(env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT"])
    assert int(env["AIRFLOW__EXACTLY_ONCE__TTL"]) * 10 < visibility
    # a task outliving it anyway: its re-delivered copy is ignored, not failing the running try
    options = env["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"]
    module, _, name = options.rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), name), dict), options
    redis = services["redis"]
    assert redis["environment"]["CHECK_SECRETS"] == "REDIS_PASSWORD"
    assert "appendonly yes" in " ".join(_command(redis)), "the broker must keep its queue"
    assert "redis-data" in compose["volumes"]
    assert "REDIS_PASSWORD=" in (DOCKER / "env.example").read_text()
    assert "REDIS_PASSWORD=" in (DOCKER / "generate-env.sh").read_text()
    assert "[demo,celery]" in (DOCKER / "Dockerfile").read_text()


def test_the_dockerfile_builds_airflow_3_3_with_the_package() -> None:
    lines = [
        line.strip()
        for line in (DOCKER / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0].startswith("FROM apache/airflow:3.3.")
    assert any(line.startswith("RUN pip install") and "/opt/exactly-once" in line for line in lines)
    for path in ("airflow_plugins", "bridge", "dags", "pyproject.toml"):
        assert any(line.startswith("COPY") and path in line for line in lines), path
        assert (DOCKER.parent / path).exists(), path


def test_the_readme_explains_the_stack() -> None:
    text = (DOCKER / "README.md").read_text()
    for needed in (
        "docker compose",
        "watcher",
        "healthcheck",
        "two schedulers",
        "Temporal",
        "CeleryExecutor",
        "Redis",
    ):
        assert needed in text, needed


def test_the_lease_agent_shares_its_socket_with_the_task_processes(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    agent = services["lease-agent"]
    assert _command(agent)[:2] == ["runlease", "agent"]
    assert agent["healthcheck"]["test"][1:] == ["runlease", "agent", "--status"]
    socket = agent["environment"]["AIRFLOW__EXACTLY_ONCE__AGENT_SOCKET"]
    folder = str(Path(socket).parent)
    for name in ("lease-agent", *WORKERS):
        env = services[name]["environment"]
        assert env["AIRFLOW__EXACTLY_ONCE__AGENT_SOCKET"] == socket, name
        assert f"lease-agent:{folder}" in services[name]["volumes"], name
    assert "lease-agent" in compose["volumes"]
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert f"mkdir -p {folder} && chown airflow" in dockerfile
