"""Bounds in time for every connection to the lease store or a sink, and ``connect_sink``.

A connection whose peer vanished without a word (a black-holed route, a dead NAT entry, a
partitioned host) otherwise waits for TCP's retransmission timeout, about 15 minutes, while a
holder that believes it still holds its lease keeps working. The libpq parameters here end
such a connection from the client's side: TCP keepalives for an idle one, ``tcp_user_timeout``
for one with data unacknowledged, ``connect_timeout`` for one that never answers. A value the
connection string sets itself wins. The store's calls are further bounded on the client's
clock by ``airflow_plugins.lease.call_watchdog`` (a route that acknowledges but never answers,
which no TCP timeout sees).
"""

from __future__ import annotations

import math
from typing import Any

import psycopg

# an idle connection is probed after KEEPALIVE_IDLE s, then every KEEPALIVE_INTERVAL s, and
# dropped after KEEPALIVE_COUNT unanswered probes: a dead idle connection is known in 25 s
KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
# data sent and not acknowledged for this long ends the connection (Linux; ignored elsewhere)
TCP_USER_TIMEOUT_MS = 15_000
DEFAULT_CONNECT_TIMEOUT = 10.0


def bounded_params(conninfo: str, *, connect_timeout: float) -> dict[str, Any]:
    """The libpq parameters that bound a connection in time, minus those ``conninfo`` sets."""
    given = psycopg.conninfo.conninfo_to_dict(conninfo)
    wanted: dict[str, Any] = {
        "connect_timeout": max(1, math.ceil(connect_timeout)),
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE,
        "keepalives_interval": KEEPALIVE_INTERVAL,
        "keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
    }
    return {name: value for name, value in wanted.items() if name not in given}


def connect_sink(
    dsn: str, *, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
) -> psycopg.Connection[Any]:
    """An autocommit connection to a sink, bounded in time (keepalives, ``tcp_user_timeout``,
    ``connect_timeout``), for the fenced transactions of a protected try or an activity.

    A sink's statements are the body's own and may rightly run long: no statement timeout is
    set here. A holder frozen inside its fenced transaction is ended by the newer holder's
    fence advance instead (``airflow_plugins.lease.sink_fence``).
    """
    return psycopg.connect(
        dsn, autocommit=True, **bounded_params(dsn, connect_timeout=connect_timeout)
    )
