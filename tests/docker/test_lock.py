"""The lock (constraints/airflow-3.3-py3.11.txt): it pins every requirement of pyproject.toml,
within its range, and every installer of the project uses it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "constraints" / "airflow-3.3-py3.11.txt"


def _pins() -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", LOCK.read_text(), re.M)
    return {canonicalize_name(name): version for name, version in found}


def test_the_lock_pins_every_requirement_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for text in (*project["dependencies"], *project["optional-dependencies"]["test"]):
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in the lock: run ./scripts/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside {requirement.specifier}: run ./scripts/lock"
        )


def test_setup_ci_and_the_image_install_with_the_lock() -> None:
    relative = str(LOCK.relative_to(REPO))
    assert f"LOCK={relative}" in (REPO / "scripts" / "setup").read_text()
    assert '-c "$LOCK"' in (REPO / "scripts" / "setup").read_text()
    assert "./scripts/setup" in (REPO / "scripts" / "test").read_text()  # what .ci/run runs
    assert f"-c /opt/exactly-once/{relative}" in (REPO / "docker" / "Dockerfile").read_text()
