"""The convention both command lines (``runlease``, ``bridge``) follow.

* Global options (``--dsn``, ``--json``) are accepted before and after the subcommand.
* ``--help`` ends with examples; the exit codes are the same for both:
  0 done, 1 refused or failed (the message says why), 2 usage or configuration,
  3 unreachable (the lease store, Temporal).
* An error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

EXIT_CODES = """exit codes:
  0  done
  1  refused or failed (the message says why)
  2  usage or configuration error
  3  unreachable (the lease store or Temporal)"""


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line, with a pointer to ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Prints ``prog: error: message (see prog --help)`` and exits with 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_global_options(
    parser: argparse.ArgumentParser,
    *,
    top: bool,
    dsn_default: str | None = None,
    dsn_help: str | None = None,
) -> None:
    """Adds the global options to the top parser (``top``) or to a subcommand's.

    A subcommand's copies default to "not given" (``SUPPRESS``), so a value given before the
    subcommand is kept unless the same option is given after it.
    """
    if dsn_help is not None:
        parser.add_argument(
            "--dsn",
            default=dsn_default if top else argparse.SUPPRESS,
            help=dsn_help,
        )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print JSON (one object a line) for scripts",
    )


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (psycopg's messages span several)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def fail(prog: str, exc: BaseException | str, code: int) -> int:
    """Prints ``prog: error: ...`` on one line to stderr; returns ``code``."""
    message = exc if isinstance(exc, str) else one_line(exc)
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code
