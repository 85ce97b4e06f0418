"""The hashes that tie the protocol model to the SQL statements it mirrors.

Each block of ``airflow_plugins/lease/model/runlease.pml`` that mirrors a statement carries a
marker ``@sql <kind>:<name> sha=<12 hex>``: ``queries:<block>`` is a named block of the lease
package's ``sql/queries.sql``; ``function:<name>`` the last ``CREATE OR REPLACE FUNCTION`` of
that name in the lease or sink migrations (a later migration redefining it wins);
``table:<name>`` the last ``CREATE TABLE`` of that name plus every ``ALTER TABLE`` of it. The
hash is over the statement without its comments and with whitespace collapsed, so a comment
edit does not ask for a model review but any change to the SQL does.

    .venv/bin/python -m tests.model.sql_hashes --check    # lists the statements that changed
    .venv/bin/python -m tests.model.sql_hashes --update   # writes today's hashes into the model
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEASE = ROOT / "airflow_plugins" / "lease"
MODEL = LEASE / "model" / "runlease.pml"
QUERIES = LEASE / "sql" / "queries.sql"
MIGRATION_DIRS = (LEASE / "sql" / "migrations", LEASE / "sql" / "sink")

_MARKER = re.compile(r"@sql (?P<kind>queries|function|table):(?P<name>[\w.]+) sha=(?P<sha>\w+)")
_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Marker:
    """One ``@sql`` marker of the model: the statement it names and the hash it records."""

    kind: str
    name: str
    recorded: str
    line: int


def normalized(sql: str) -> str:
    """The statement without ``--`` comments, whitespace collapsed."""
    no_comments = re.sub(r"--[^\n]*", "", sql)
    return " ".join(no_comments.split())


def digest(sql: str) -> str:
    """The 12 hex characters of the normalized statement's sha256 the model records."""
    return hashlib.sha256(normalized(sql).encode()).hexdigest()[:12]


def _migrations() -> list[Path]:
    files: list[Path] = []
    for folder in MIGRATION_DIRS:
        files.extend(sorted(folder.glob("*.sql")))
    return files


def _query_block(name: str) -> str:
    parts = _BLOCK.split(QUERIES.read_text())
    blocks = dict(zip(parts[1::2], parts[2::2], strict=True))
    if name not in blocks:
        raise LookupError(f"no block {name!r} in {QUERIES.relative_to(ROOT)}")
    return blocks[name]


def _function(name: str) -> str:
    pattern = re.compile(
        rf"CREATE OR REPLACE FUNCTION {re.escape(name)}\(.*?\$\$;", re.DOTALL | re.IGNORECASE
    )
    found = [m.group(0) for path in _migrations() for m in pattern.finditer(path.read_text())]
    if not found:
        raise LookupError(f"no function {name} in the lease or sink migrations")
    return found[-1]


def _table(name: str) -> str:
    create = re.compile(
        rf"CREATE TABLE (?:IF NOT EXISTS )?{re.escape(name)} \(.*?\n\);", re.DOTALL | re.I
    )
    alter = re.compile(rf"ALTER TABLE (?:IF EXISTS )?{re.escape(name)}\b[^;]*;", re.I)
    created: list[str] = []
    altered: list[str] = []
    for path in _migrations():
        text = path.read_text()
        created.extend(m.group(0) for m in create.finditer(text))
        altered.extend(m.group(0) for m in alter.finditer(text))
    if not created:
        raise LookupError(f"no table {name} in the lease or sink migrations")
    return "\n".join([created[-1], *altered])


def statement(kind: str, name: str) -> str:
    """Today's text of the statement a marker names.

    Raises:
        LookupError: the statement is gone (renamed or dropped): the model needs a look.
    """
    if kind == "queries":
        return _query_block(name)
    if kind == "function":
        return _function(name)
    return _table(name)


def markers(model: Path = MODEL) -> list[Marker]:
    """The ``@sql`` markers of the model, in file order."""
    found = []
    for number, text in enumerate(model.read_text().splitlines(), start=1):
        for m in _MARKER.finditer(text):
            found.append(Marker(m["kind"], m["name"], m["sha"], number))
    return found


def stale(model: Path = MODEL) -> list[str]:
    """One line per marker whose statement changed (or is gone) since it was hashed."""
    problems = []
    for mark in markers(model):
        try:
            now = digest(statement(mark.kind, mark.name))
        except LookupError as exc:
            problems.append(f"{model.name}:{mark.line}: {exc}")
            continue
        if now != mark.recorded:
            problems.append(
                f"{model.name}:{mark.line}: {mark.kind}:{mark.name} changed "
                f"(model records {mark.recorded}, the SQL is now {now})"
            )
    return problems


def update(model: Path = MODEL) -> int:
    """Writes today's hash into every marker; returns how many changed."""
    changed = 0

    def fresh(m: re.Match[str]) -> str:
        nonlocal changed
        now = digest(statement(m["kind"], m["name"]))
        changed += now != m["sha"]
        return f"@sql {m['kind']}:{m['name']} sha={now}"

    model.write_text(_MARKER.sub(fresh, model.read_text()))
    return changed


def main(argv: list[str]) -> int:
    """``--check`` (exit 1 when a mirrored statement changed) or ``--update``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--update", action="store_true")
    args = parser.parse_args(argv)
    if args.update:
        print(f"{update()} marker(s) updated in {MODEL.relative_to(ROOT)}")
        return 0
    problems = stale()
    for line in problems:
        print(line)
    if problems:
        print(
            "review the model blocks above against the changed SQL, then run "
            ".venv/bin/python -m tests.model.sql_hashes --update"
        )
        return 1
    print(f"{len(markers())} SQL statements match the model")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
