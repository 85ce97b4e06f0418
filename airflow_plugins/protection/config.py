"""The plugin's options: the ``[exactly_once]`` section of ``airflow.cfg``.

Every option is declared in ``OPTIONS`` with its type, default and meaning (``airflow config
list --section exactly_once`` shows them; docs/airflow_plugin.md's "Configuration" table is the
reference) and read lazily by a small function when it is needed, never at import time: a DAG
file importing the operator must not need a configured Airflow. Each can also be set by
environment, Airflow's usual way: ``AIRFLOW__EXACTLY_ONCE__TTL=30``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any

import psycopg

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.errors import InvalidLeaseInput, SinkNotConfigured

SECTION = "exactly_once"


@dataclasses.dataclass(frozen=True)
class Option:
    """One declared option of the ``[exactly_once]`` section."""

    name: str
    type: type
    default: str
    description: str
    example: str = ""
    """A value a user might set (shown by ``airflow config list``; empty: the default)."""
    sensitive: bool = False
    """Whether the value may carry a secret (hidden by Airflow's config views)."""


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("enabled", bool, "True", "protect at all (False: bodies run plainly)", "False"),
        Option(
            "lease_conn_id",
            str,
            "exactly_once_leases",
            "Connection of the lease store",
            "exactly_once_leases",
        ),
        Option(
            "lease_dsn",
            str,
            "",
            "DSN of the lease store; overrides lease_conn_id",
            "postgresql://runlease@leases-db/leases",
            sensitive=True,
        ),
        Option("ttl", float, "60", "seconds a lease lives unless renewed", "30"),
        Option("heartbeat", float, "0", "seconds between renewals (0: ttl / 3)", "10"),
        Option(
            "opt_in_tag", str, "exactly-once", "DAG tag that opts a DAG into the policy", "billing"
        ),
        Option("horizon_days", int, "400", "retention horizon of the lease store, days", "800"),
        Option("wait_poll_interval", float, "5", "seconds between checks while deferred", "2"),
        Option("wait_at_least", float, "10", "seconds a deferred task waits before resuming", "5"),
        Option(
            "router",
            str,
            "",
            "module:attribute of the Router deciding the engine",
            "bridge.in_airflow.router:BridgeRouter",
        ),
        Option(
            "complete_timeout",
            float,
            "3600",
            "seconds a try whose work returned retries recording it while the store is away",
            "600",
        ),
        Option(
            "agent_socket",
            str,
            "",
            "Unix socket of this host's lease agent (runlease agent)",
            "/run/runlease/agent.sock",
        ),
    )
}


# Airflow's own lookup walks environment, commands, secrets, the file and the defaults for each
# option, and a protected try reads ten of them. The environment variable, which wins
# over everything, is read directly each time; the rest is looked up once per process and kept
# for CONF_CACHE_SECONDS (a ``_secret`` or ``_cmd`` option that rotates is seen after that).
CONF_CACHE_SECONDS = 60.0
_conf_cache: dict[str, tuple[float, str]] = {}


def _raw(name: str) -> str:
    option = OPTIONS[name]
    value = os.environ.get(f"AIRFLOW__{SECTION.upper()}__{name.upper()}")
    if value is not None and "$" not in value and not value.startswith("~"):
        return value.strip()  # as Airflow reads it (it only expands $VARS and ~ first)
    now = time.monotonic()
    cached = _conf_cache.get(name)
    if value is None and cached is not None and now - cached[0] < CONF_CACHE_SECONDS:
        return cached[1]
    from airflow.configuration import conf

    found = conf.get(SECTION, name, fallback=option.default)
    text = option.default if found is None else str(found).strip()
    if value is None:
        _conf_cache[name] = (now, text)
    return text


def preload() -> None:
    """Reads every option once, so a protected try finds them kept (see ``_raw``); done by the
    lease store's warm-up while Airflow still prepares the task."""
    for name in OPTIONS:
        _raw(name)


def enabled() -> bool:
    """Whether protection is on (``[exactly_once] enabled``)."""
    return _raw("enabled").lower() in ("true", "1", "yes", "on", "t", "y")


def lease_conn_id() -> str:
    """The Airflow Connection id of the lease store."""
    return _raw("lease_conn_id") or OPTIONS["lease_conn_id"].default


def ttl() -> float:
    """Lease TTL in seconds."""
    return _number("ttl", float)


def heartbeat() -> float:
    """Seconds between lease renewals (a third of the TTL unless set)."""
    value = _number("heartbeat", float)
    return value if value > 0 else ttl() / 3


def opt_in_tag() -> str:
    """The DAG tag that opts a DAG into the cluster policy."""
    return _raw("opt_in_tag") or OPTIONS["opt_in_tag"].default


def horizon_days() -> int:
    """The lease store's retention horizon in days."""
    return int(_number("horizon_days", int))


def wait_poll_interval() -> float:
    """Seconds between lease-store checks of a deferred, waiting task."""
    return max(0.2, _number("wait_poll_interval", float))


def wait_at_least() -> float:
    """Seconds a deferred protected task waits at least before its trigger fires.

    Airflow 3.3 fails a deferred try resumed before the scheduler has handled the executor's
    event of the process that deferred (apache/airflow#71580, #72716): a trigger firing at once
    would cost the resumed try a retry, or the task with none left.
    """
    return max(0.0, _number("wait_at_least", float))


def complete_timeout() -> float:
    """Seconds a try whose work returned keeps retrying its completion while the lease store
    is away (renewing meanwhile) before it fails loudly; the work is never run again for it."""
    return max(0.0, _number("complete_timeout", float))


def router_path() -> str:
    """``module:attribute`` of the configured router, or empty."""
    return _raw("router")


def runlease_defaults(have_dsn: bool) -> tuple[str | None, str | None]:
    """``runlease agent``'s defaults from these options (entry point ``runlease.defaults``).

    Raises ``LeaseError`` when the DSN is needed and not configured.
    """
    return (None if have_dsn else lease_dsn()), (agent_socket() or None)


def agent_socket() -> str:
    """The Unix socket of this host's lease agent, or empty (none)."""
    return _raw("agent_socket")


def _number(name: str, kind: type[int] | type[float]) -> float:
    text = _raw(name)
    try:
        return kind(text)
    except ValueError as exc:
        raise InvalidLeaseInput(f"[{SECTION}] {name} = {text!r} is not a number") from exc


# -- the lease store's address ------------------------------------------------------------------


def dsn_of_connection(conn: Any) -> str:
    """A libpq DSN from an Airflow Connection of type postgres (host, port, login, schema)."""
    extra = dict(getattr(conn, "extra_dejson", None) or {})
    params: dict[str, Any] = {
        "host": conn.host or None,
        "port": conn.port or None,
        "user": conn.login or None,
        "password": conn.password or None,
        "dbname": conn.schema or None,
    }
    for name in ("sslmode", "sslrootcert", "sslcert", "sslkey", "options", "application_name"):
        if extra.get(name):
            params[name] = extra[name]
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if v is not None})


_env_dsns: dict[tuple[str, str], str] = {}
_POSTGRES_TYPES = ("postgres", "postgresql")


def _connection_from_env(conn_id: str) -> str | None:
    """The DSN of ``AIRFLOW_CONN_<ID>`` (Airflow's URI or JSON form, or a libpq string)."""
    name = f"AIRFLOW_CONN_{conn_id.upper()}"
    value = os.environ.get(name)
    if not value:
        return None
    dsn = _env_dsns.get((conn_id, value))
    if dsn is None:  # parsed once per value (a quarter of a millisecond each time otherwise)
        if not value.lstrip().startswith("{") and "://" not in value:
            dsn = value  # a libpq key=value string
        else:
            from airflow.sdk import Connection

            if value.lstrip().startswith("{"):
                conn = Connection.from_json(value, conn_id=conn_id)
            else:
                conn = Connection.from_uri(value, conn_id=conn_id)
            if conn.conn_type not in _POSTGRES_TYPES:
                raise SinkNotConfigured(f"{name} is a {conn.conn_type!r} connection, not Postgres")
            dsn = dsn_of_connection(conn)
        _env_dsns[(conn_id, value)] = dsn
    return dsn


def lease_dsn(*, metastore: bool = True, conn_id: str | None = None) -> str:
    """The lease store's DSN: ``lease_dsn``, else the Connection ``lease_conn_id``.

    Args:
        metastore: whether the Connection may be looked up through Airflow (task code, the
            triggerer). Scheduler-side hooks pass False: only the option and the
            ``AIRFLOW_CONN_*`` environment variable are read there, since a metadata-database
            session opened inside a scheduler hook breaks the scheduler's own.
        conn_id: a task's own lease Connection (the operator's ``lease_conn_id``); it wins
            over both options.

    Raises:
        InvalidLeaseInput: no lease store is configured (fail closed: nothing protected runs).
    """
    if conn_id is None:
        if configured := _raw("lease_dsn"):
            return configured
        conn_id = lease_conn_id()
    if from_env := _connection_from_env(conn_id):
        return from_env
    if metastore:
        from airflow.sdk import BaseHook

        try:
            return dsn_of_connection(BaseHook.get_connection(conn_id))
        except Exception as exc:  # Airflow raises its own NotFound types per context
            raise InvalidLeaseInput(
                f"the lease store is not configured: Connection {conn_id!r} could not be read "
                f"({exc}); set [{SECTION}] lease_conn_id or lease_dsn"
            ) from exc
    raise InvalidLeaseInput(
        f"the lease store is not configured here: set [{SECTION}] lease_dsn or "
        f"AIRFLOW_CONN_{conn_id.upper()}"
    )


def sink_dsn(conn_id: str, *, metastore: bool = True) -> str:
    """The DSN of a sink's Airflow Connection (type postgres), extras such as sslmode honoured.

    ``AIRFLOW_CONN_<ID>`` first, then (``metastore``, in Airflow's processes) the Connection
    Airflow keeps. The bridge worker passes ``metastore=False``: one variable serves both
    engines.

    Raises:
        SinkNotConfigured: the connection is missing (without the metastore) or not Postgres.
    """
    if dsn := _connection_from_env(conn_id):
        return dsn
    if not metastore:
        raise SinkNotConfigured(
            f"sink connection {conn_id!r} is not configured: set AIRFLOW_CONN_{conn_id.upper()}"
        )
    from airflow.sdk import BaseHook

    return dsn_of_connection(BaseHook.get_connection(conn_id))


_stores: dict[tuple[str, float, int, float, str], LeaseStore] = {}
_stores_lock = threading.Lock()


def lease_store(dsn: str | None = None, *, connect_timeout: float = 5.0) -> LeaseStore:
    """The process's lease store for ``dsn`` (default: the configured one), opened once.

    A store is a small connection pool; one per process and DSN keeps tasks from paying a new
    connection per call.
    """
    dsn = dsn or lease_dsn()
    cache_key = (dsn, connect_timeout, horizon_days(), ttl(), agent_socket())
    with _stores_lock:
        store = _stores.get(cache_key)
        if store is None:
            store = LeaseStore(
                dsn,
                ttl=cache_key[3],
                horizon_days=cache_key[2],
                connect_timeout=connect_timeout,
                agent_socket=cache_key[4] or None,
            )
            _stores[cache_key] = store
        return store


_task_dsns: dict[str | None, str] = {}


def task_lease_store(conn_id: str | None = None) -> LeaseStore:
    """The lease store of a task process: ``conn_id`` (a task's own ``lease_conn_id``) or the
    configured one.

    A Connection kept in Airflow's metastore is read once per process (the task SDK asks the
    supervisor, which asks the API server): a task process lives for one try, so it cannot go
    stale there, and the protected try, its listener hooks and the warm-up started while the
    DAG file is parsed share one store. An option or ``AIRFLOW_CONN_*`` variable is read each
    time (a changed value is seen at once).

    Raises:
        InvalidLeaseInput: no lease store is configured.
    """
    try:
        return lease_store(lease_dsn(metastore=False, conn_id=conn_id))
    except InvalidLeaseInput:
        pass  # the Connection is in Airflow's metastore
    with _stores_lock:
        dsn = _task_dsns.get(conn_id)
    if dsn is None:
        dsn = lease_dsn(conn_id=conn_id)
        with _stores_lock:
            _task_dsns[conn_id] = dsn
    return lease_store(dsn)
