"""The README's layout and its guarantees table match the tree: every link resolves, every named
function, class or query exists where the table says, and every package is in the layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def _table_rows() -> list[str]:
    rows = [
        line
        for line in _section("Where each guarantee lives").splitlines()
        if line.startswith("| ")
    ]
    return rows[1:]  # the header; the separator starts with "| ---" and holds no link


def _defines(path: Path, name: str) -> bool:
    text = path.read_text()
    if path.suffix == ".sql":
        return re.search(rf"^-- name: {re.escape(name)}$", text, re.M) is not None
    return re.search(rf"^\s*(async def|def|class) {re.escape(name)}\b", text, re.M) is not None


def _claims() -> list[tuple[str, str | None]]:
    claims: list[tuple[str, str | None]] = []
    for row in _table_rows():
        for link, names in re.findall(r"\]\(([^)]+)\)((?:\s*`[^`]+`)*)", row):
            found = re.findall(r"`([^`]+)`", names)
            claims += [(link, name) for name in found] or [(link, None)]
    return claims


def test_the_table_has_a_row_per_guarantee_and_each_names_a_test() -> None:
    rows = [row for row in _table_rows() if not row.startswith("| ---")]
    assert len(rows) >= 15
    assert all("tests/" in row.rsplit("|", 2)[-2] for row in rows)


@pytest.mark.parametrize(("link", "name"), _claims(), ids=lambda v: str(v))
def test_each_link_resolves_to_what_it_names(link: str, name: str | None) -> None:
    path = ROOT / link
    assert path.is_file(), f"{link} does not exist"
    if name is not None:
        assert _defines(path, name), f"{link} defines no {name!r}"


def test_the_layout_names_every_package_and_nothing_that_is_gone() -> None:
    layout = _section("Layout")
    block = layout[layout.index("```") : layout.rindex("```")]
    named = set(re.findall(r"^([a-z_]+(?:/[a-z_]+)*/)", block, re.M))
    for folder in named:
        assert (ROOT / folder).is_dir(), f"the layout names {folder}, which is not in the tree"
    packages = {
        f"{p.parent.relative_to(ROOT).as_posix()}/"
        for top in ("airflow_plugins", "bridge")
        for p in (ROOT / top).glob("*/__init__.py")
    }
    packages -= {"bridge/sql/"}  # the bridge's SQL files, named with bridge/
    assert packages <= named, f"not in the README's layout: {sorted(packages - named)}"
