"""Named SQL blocks from a package's ``.sql`` file, loaded once.

A block starts with a line ``-- name: <name>``; its text runs until the next such line. The
lease store's own blocks are in ``sql/queries.sql``; the views, the watcher and the bridge keep
theirs beside their code and load them with a ``QueryBook`` of their own.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


class QueryBook:
    """The named blocks of one ``.sql`` file of a package; call it with a block's name.

    The file is read when the book is made, at import: a process forked afterwards (each task
    process of a LocalExecutor or Celery worker, whose parent imported the plugin) finds the
    text already loaded instead of reading and splitting the file on its try's path.

    Args:
        package: the package that ships the file, e.g. ``"airflow_plugins.lease"``.
        path: the file's path inside the package, e.g. ``"sql/queries.sql"``.
    """

    def __init__(self, package: str, path: str) -> None:
        self.source = f"{package}/{path}"
        text = resources.files(package).joinpath(path).read_text()
        parts = _NAME.split(text)  # [preamble, name1, body1, name2, body2, ...]
        self._blocks = {
            name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)
        }

    def __call__(self, name: str) -> str:
        """Returns the SQL text of the named block.

        Raises:
            KeyError: no block has that name (the message names the file).
        """
        try:
            return self._blocks[name]
        except KeyError:
            raise KeyError(f"no SQL block {name!r} in {self.source}") from None


query = QueryBook("airflow_plugins.lease", "sql/queries.sql")
