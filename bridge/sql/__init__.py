"""The bridge's SQL: numbered migrations and named query blocks, loaded once.

A block in ``queries.sql`` starts with a line ``-- name: <name>``; its text runs until the next.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _blocks() -> dict[str, str]:
    text = resources.files("bridge.sql").joinpath("queries.sql").read_text()
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def query(name: str) -> str:
    """The SQL text of the named block.

    Raises:
        KeyError: no block has that name.
    """
    return _blocks()[name]
