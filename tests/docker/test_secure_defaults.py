"""docker/ is secure by default: the start-up check refuses weak secrets, nothing listens on all
interfaces unless told, no service is the superuser, no DSN with a password is on a command line.

No Docker engine runs here: docker/check-secrets.sh (what every container runs before its own
entrypoint) is run directly with a table of hostile environments, docker/generate-env.sh's output
must pass it, and the compose file is read for the rest.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
CHECK = DOCKER / "check-secrets.sh"
STRONG = "Jq3v9Xw0-strong-and-long"
FERNET = "x" * 43 + "="

# (case, environment, starts)
ENVIRONMENTS: list[tuple[str, dict[str, str], bool]] = [
    ("strong secrets", {"A": STRONG, "AIRFLOW_FERNET_KEY": FERNET}, True),
    ("unset", {"AIRFLOW_FERNET_KEY": FERNET}, False),
    ("empty", {"A": "", "AIRFLOW_FERNET_KEY": FERNET}, False),
    ("the old default", {"A": "change-me", "AIRFLOW_FERNET_KEY": FERNET}, False),
    ("the old JWT default", {"A": "change-me-too", "AIRFLOW_FERNET_KEY": FERNET}, False),
    ("admin", {"A": "admin", "AIRFLOW_FERNET_KEY": FERNET}, False),
    ("short", {"A": "s3cr3t!", "AIRFLOW_FERNET_KEY": FERNET}, False),
    ("empty Fernet key", {"A": STRONG, "AIRFLOW_FERNET_KEY": ""}, False),
    ("not a Fernet key", {"A": STRONG, "AIRFLOW_FERNET_KEY": STRONG * 2}, False),
    ("shell in a value", {"A": "$(touch /tmp/eo-pwned)x" * 2, "AIRFLOW_FERNET_KEY": FERNET}, True),
]


def _check(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(CHECK), *command],
        env={"PATH": os.environ["PATH"], "CHECK_SECRETS": "A AIRFLOW_FERNET_KEY", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "starts"), [e[1:] for e in ENVIRONMENTS], ids=[e[0] for e in ENVIRONMENTS]
)
def test_the_start_up_check_refuses_weak_secrets(env: dict[str, str], starts: bool) -> None:
    done = _check(env, "echo", "started")
    assert (done.stdout.strip() == "started") is starts, done.stderr
    assert (done.returncode == 0) is starts
    if not starts:
        assert "refusing to start" in done.stderr
    for value in env.values():
        if value:
            assert value not in done.stderr  # the check never prints a secret
    assert not Path("/tmp/eo-pwned").exists()


def test_generated_secrets_pass_the_check(tmp_path: Path) -> None:
    target = tmp_path / ".env"
    subprocess.run(["sh", str(DOCKER / "generate-env.sh"), str(target)], check=True, timeout=30)
    assert target.stat().st_mode & 0o077 == 0  # readable by its owner only
    values = dict(line.split("=", 1) for line in target.read_text().splitlines() if "=" in line)
    secrets = [k for k in values if k.endswith(("PASSWORD", "SECRET", "KEY"))]
    assert len(secrets) >= 8
    done = subprocess.run(
        ["sh", str(CHECK), "true"],
        env={"PATH": os.environ["PATH"], "CHECK_SECRETS": " ".join(secrets), **values},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    return loaded


def test_the_stack_is_secure_by_default(compose: dict[str, Any]) -> None:
    text = (DOCKER / "docker-compose.yml").read_text()
    assert "change-me" not in text
    assert not re.search(r"\$\{[A-Z_]*(PASSWORD|SECRET|KEY|PWD)[A-Z_]*:-", text)  # no defaults
    for name, service in compose["services"].items():
        entry = service.get("entrypoint") or []
        if name != "statsd-exporter":  # holds no secret and publishes no port
            assert any("check-secrets.sh" in part for part in entry), name
        for port in service.get("ports", []):
            assert str(port).startswith("${EO_BIND_ADDRESS:-127.0.0.1}:"), (name, port)
        env = service.get("environment") or {}
        for key, value in env.items():
            if isinstance(value, str) and value.startswith("postgres"):
                assert "://postgres:" not in value, (name, key)  # not the superuser
        command = " ".join(service.get("command") or [])
        assert not re.search(r"://[^/\s:]+:[^@\s]+@", command), name
        assert "--dsn" not in command, name
    tasks = compose["services"]["airflow-scheduler-1"]["environment"]
    assert "runlease_task:" in tasks["AIRFLOW_CONN_EXACTLY_ONCE_LEASES"]
    pages = compose["services"]["airflow-apiserver"]["environment"]
    assert "runlease_operator:" in pages["AIRFLOW_CONN_EXACTLY_ONCE_LEASES"]


def test_docker_env_is_never_committed() -> None:
    ignored = (DOCKER.parent / ".gitignore").read_text().splitlines()
    assert "docker/.env" in ignored
