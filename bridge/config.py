"""The bridge's settings: environment first, then Airflow's ``[bridge]`` section, then defaults.

Read lazily by ``BridgeConfig.load()``, never at import time.

===========================  ========================  ===========================================
env                          airflow.cfg [bridge]      default
===========================  ========================  ===========================================
BRIDGE_TEMPORAL_ADDR         temporal_address          localhost:7233
BRIDGE_NAMESPACE             namespace                 default
BRIDGE_QUEUE_PREFIX          task_queue_prefix         bridge
BRIDGE_LANES                 lanes                     billing:16,default:8,analytics:4
BRIDGE_LEASE_DSN             lease_dsn                 (required by the worker)
BRIDGE_DAGS_FOLDER           dags_folder               (none: registered/importable code only)
BRIDGE_MAX_PAYLOAD           max_payload_bytes         2000000 (under Temporal's 2 MiB blob limit)
BRIDGE_READY_AFTER           ready_after               5 matching shadow runs
BRIDGE_COMPARE_POLL_S        compare_poll_s            30 (a shadow polls for the primary's end)
BRIDGE_TEMPORAL_TLS          temporal_tls              false (true: TLS with the system's CAs)
BRIDGE_TEMPORAL_CA           temporal_tls_ca_file      (none: the system's CAs) a PEM CA bundle
BRIDGE_TEMPORAL_CERT         temporal_tls_cert_file    (none) client certificate PEM, for mTLS
BRIDGE_TEMPORAL_KEY          temporal_tls_key_file     (none) its private key PEM, for mTLS
BRIDGE_TEMPORAL_SNI          temporal_tls_server_name  (none: the address's host) name to verify
BRIDGE_AIRFLOW_API_URL       airflow_api_url           (none) the api-server (whole-DAG shadows)
BRIDGE_AIRFLOW_API_USER      airflow_api_user          (none) a user that may read runs, TIs, XComs
BRIDGE_AIRFLOW_API_PASSWORD  airflow_api_password      (none) its password (never logged or shown)
===========================  ========================  ===========================================

Any of the CA, certificate or server name options turns TLS on; a certificate needs its key.
"""

from __future__ import annotations

import dataclasses
import os

DEFAULT_LANES = "billing:16,default:8,analytics:4"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One declared setting: its environment variable, its ``[bridge]`` option and meaning.

    The provider's ``get_provider_info`` (``airflow_plugins.provider_info``) publishes these to
    ``airflow config list``; ``BridgeConfig``'s defaults are checked against them by a test.
    """

    env: str
    option: str
    type: type
    default: str
    description: str
    example: str
    sensitive: bool = False


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "BRIDGE_TEMPORAL_ADDR",
        "temporal_address",
        str,
        "localhost:7233",
        "host:port of the Temporal frontend",
        "temporal:7233",
    ),
    Setting("BRIDGE_NAMESPACE", "namespace", str, "default", "Temporal namespace", "billing"),
    Setting(
        "BRIDGE_QUEUE_PREFIX",
        "task_queue_prefix",
        str,
        "bridge",
        "prefix of the lanes' task queues (<prefix>-<lane>)",
        "bridge",
    ),
    Setting(
        "BRIDGE_LANES",
        "lanes",
        str,
        DEFAULT_LANES,
        "priority lanes and their activity slots per worker, name:slots,...",
        "billing:32,default:8",
    ),
    Setting(
        "BRIDGE_LEASE_DSN",
        "lease_dsn",
        str,
        "",
        "the lease store's DSN (required by the worker)",
        "postgresql://runlease@leases-db/leases",
        sensitive=True,
    ),
    Setting(
        "BRIDGE_DAGS_FOLDER",
        "dags_folder",
        str,
        "",
        "DAG folder the worker imports DAG code from (empty: registered/importable code only)",
        "/opt/airflow/dags",
    ),
    Setting(
        "BRIDGE_MAX_PAYLOAD",
        "max_payload_bytes",
        int,
        "2000000",
        "largest payload handed to Temporal, bytes (under its 2 MiB blob limit)",
        "1000000",
    ),
    Setting(
        "BRIDGE_READY_AFTER",
        "ready_after",
        int,
        "5",
        "matching shadow runs before a DAG is ready to cut over",
        "10",
    ),
    Setting(
        "BRIDGE_COMPARE_POLL_S",
        "compare_poll_s",
        float,
        "30",
        "seconds between a shadow run's checks for the primary's end",
        "10",
    ),
    Setting(
        "BRIDGE_AIRFLOW_API_URL",
        "airflow_api_url",
        str,
        "",
        "Airflow's api-server, read by a whole-DAG shadow's comparison (empty: none)",
        "http://airflow-api:8080",
    ),
    Setting(
        "BRIDGE_AIRFLOW_API_USER",
        "airflow_api_user",
        str,
        "",
        "the user the worker reads DAG runs, task instances and XComs as",
        "bridge-reader",
    ),
    Setting(
        "BRIDGE_AIRFLOW_API_PASSWORD",
        "airflow_api_password",
        str,
        "",
        "that user's password (never logged or shown)",
        "change-me",
        sensitive=True,
    ),
)


class ConfigError(ValueError):
    """A setting with a value the bridge cannot use."""


class TemporalUnavailable(RuntimeError):
    """The Temporal server could not be reached: nothing was started; retry later."""


def _airflow_option(name: str) -> str | None:
    # only where Airflow is deployed: importing its config elsewhere would create ~/airflow
    if not (os.environ.get("AIRFLOW_HOME") or os.environ.get("AIRFLOW_CONFIG")):
        return None
    try:
        from airflow.configuration import conf
    except ImportError:
        return None
    value = conf.get("bridge", name, fallback=None)
    return str(value) if value not in (None, "") else None


def _setting(env: str, option: str, default: str | None) -> str | None:
    return os.environ.get(env) or _airflow_option(option) or default


def parse_lanes(text: str) -> dict[str, int]:
    """``billing:16,default:8`` -> {"billing": 16, "default": 8} (lane -> activity slots).

    Raises:
        ConfigError: malformed.
    """
    lanes: dict[str, int] = {}
    for part in text.split(","):
        name, _, slots = part.strip().partition(":")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise ConfigError(f"lane {part!r} is not name:slots (e.g. billing:16)")
        lanes[name] = int(slots)
    if not lanes:
        raise ConfigError("at least one lane is needed")
    return lanes


@dataclasses.dataclass(frozen=True)
class BridgeConfig:
    """Where Temporal and the lease store are, and how the worker divides its slots."""

    temporal_address: str = "localhost:7233"
    namespace: str = "default"
    task_queue_prefix: str = "bridge"
    lanes: dict[str, int] = dataclasses.field(default_factory=lambda: parse_lanes(DEFAULT_LANES))
    lease_dsn: str | None = None
    dags_folder: str | None = None
    max_payload_bytes: int = 2_000_000
    ready_after: int = 5
    compare_poll_s: float = 30.0
    temporal_tls: bool = False
    temporal_tls_ca_file: str | None = None
    temporal_tls_cert_file: str | None = None
    temporal_tls_key_file: str | None = None
    temporal_tls_server_name: str | None = None
    airflow_api_url: str | None = None
    airflow_api_user: str | None = None
    airflow_api_password: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def load(cls) -> BridgeConfig:
        """Reads the settings now (environment, then airflow.cfg, then defaults)."""
        return cls(
            temporal_address=_setting("BRIDGE_TEMPORAL_ADDR", "temporal_address", "localhost:7233")
            or "",
            namespace=_setting("BRIDGE_NAMESPACE", "namespace", "default") or "default",
            task_queue_prefix=_setting("BRIDGE_QUEUE_PREFIX", "task_queue_prefix", "bridge")
            or "bridge",
            lanes=parse_lanes(_setting("BRIDGE_LANES", "lanes", DEFAULT_LANES) or DEFAULT_LANES),
            lease_dsn=_setting("BRIDGE_LEASE_DSN", "lease_dsn", None),
            dags_folder=_setting("BRIDGE_DAGS_FOLDER", "dags_folder", None),
            max_payload_bytes=int(
                _setting("BRIDGE_MAX_PAYLOAD", "max_payload_bytes", "2000000") or 0
            ),
            ready_after=int(_setting("BRIDGE_READY_AFTER", "ready_after", "5") or 5),
            compare_poll_s=float(_setting("BRIDGE_COMPARE_POLL_S", "compare_poll_s", "30") or 30.0),
            temporal_tls=(_setting("BRIDGE_TEMPORAL_TLS", "temporal_tls", "false") or "").lower()
            in ("1", "true", "yes"),
            temporal_tls_ca_file=_setting("BRIDGE_TEMPORAL_CA", "temporal_tls_ca_file", None),
            temporal_tls_cert_file=_setting("BRIDGE_TEMPORAL_CERT", "temporal_tls_cert_file", None),
            temporal_tls_key_file=_setting("BRIDGE_TEMPORAL_KEY", "temporal_tls_key_file", None),
            temporal_tls_server_name=_setting(
                "BRIDGE_TEMPORAL_SNI", "temporal_tls_server_name", None
            ),
            airflow_api_url=_setting("BRIDGE_AIRFLOW_API_URL", "airflow_api_url", None),
            airflow_api_user=_setting("BRIDGE_AIRFLOW_API_USER", "airflow_api_user", None),
            airflow_api_password=_setting(
                "BRIDGE_AIRFLOW_API_PASSWORD", "airflow_api_password", None
            ),
        )

    def task_queue(self, lane: str) -> str:
        """The task queue of a priority lane (unknown lanes run on ``default``).

        Raises:
            ConfigError: neither the lane nor ``default`` is configured.
        """
        if lane not in self.lanes:
            if "default" not in self.lanes:
                raise ConfigError(f"lane {lane!r} is not one of {sorted(self.lanes)}")
            lane = "default"
        return f"{self.task_queue_prefix}-{lane}"
