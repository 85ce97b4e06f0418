"""Named SQL blocks from ``sql/queries.sql`` of this package, loaded once.

A block starts with a line ``-- name: <name>``; its text runs until the next such line.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _blocks() -> dict[str, str]:
    text = resources.files("airflow_plugins.views").joinpath("sql/queries.sql").read_text()
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def query(name: str) -> str:
    """Returns the SQL text of the named block.

    Raises:
        KeyError: no block has that name.
    """
    return _blocks()[name]
