"""Options of the watcher and the views, read lazily from Airflow's config (``[exactly_once]``).

Every option has a type and a default, and is read when it is needed, never at import time, so
tests and the watcher's command set them through ``AIRFLOW__EXACTLY_ONCE__*`` variables.

The lease store (``lease_dsn`` / ``lease_conn_id``) and the opt-in tag are the plugin's own
options (``airflow_plugins.protection.config``).

=============================  ===========  ==================================================
option                         default      meaning
=============================  ===========  ==================================================
watcher_deadline_seconds       900          a run not done this long after its scheduled time
                                            is missed (at least one schedule interval)
watcher_deadlines              (empty)      per-DAG deadlines: ``dag_a=600,dag_b=14400``
watcher_poll_seconds           30           how often the watcher looks
watcher_lookback_hours         48           how far back each look goes
watcher_callback               (empty)      ``module:function`` called with each new missed run
watcher_health_port            8790         the watcher's ``/health`` endpoint (0: off)
watcher_health_host            127.0.0.1    where it listens (``0.0.0.0``: every interface)
watcher_health_file            (empty)      a file the watcher touches after every good look
=============================  ===========  ==================================================
"""

from __future__ import annotations

from datetime import timedelta

SECTION = "exactly_once"


def _get(option: str, default: str) -> str:
    from airflow.configuration import conf

    value = conf.get(SECTION, option, fallback=default)
    return default if value is None else str(value)


def lease_store_dsn() -> str:
    """The lease store's DSN, as the plugin reads it
    (``airflow_plugins.protection.config.lease_dsn``).

    Raises:
        InvalidLeaseInput: no lease store is configured.
    """
    from airflow_plugins.protection import config

    return config.lease_dsn(metastore=True)


def deadline_for(dag_id: str, interval: timedelta) -> timedelta:
    """How long after its scheduled time a run of ``dag_id`` may finish before it is missed."""
    for part in _get("watcher_deadlines", "").split(","):
        name, _, seconds = part.strip().partition("=")
        if name == dag_id and seconds.strip():
            return timedelta(seconds=float(seconds))
    default = timedelta(seconds=float(_get("watcher_deadline_seconds", "900")))
    return max(default, interval)


def poll_seconds() -> float:
    """Seconds between two looks of the watcher."""
    return max(1.0, float(_get("watcher_poll_seconds", "30")))


def lookback() -> timedelta:
    """How far back each look of the watcher goes."""
    return timedelta(hours=float(_get("watcher_lookback_hours", "48")))


def callback_path() -> str:
    """``module:function`` to call with each newly missed run, or empty."""
    return _get("watcher_callback", "").strip()


def health_port() -> int:
    """The port of the watcher's health endpoint (0 turns it off)."""
    return int(_get("watcher_health_port", "8790"))


def health_host() -> str:
    """Where the health endpoint listens (the loopback unless told otherwise)."""
    return _get("watcher_health_host", "127.0.0.1").strip() or "127.0.0.1"


def health_file() -> str:
    """A file touched after each good look (empty: none)."""
    return _get("watcher_health_file", "").strip()
