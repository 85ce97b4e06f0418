"""``get_provider_info``: what the package declares to Airflow as a provider.

Registered through the ``apache_airflow_provider`` entry point, so ``airflow providers list``
shows the package, ``airflow config list`` shows the ``[exactly_once]`` and ``[bridge]``
sections with their types, defaults and examples, and the lease store's connection type is
offered in the Connections form. The sections are built from the declarations in
``airflow_plugins.protection.config.OPTIONS`` and ``bridge.config.SETTINGS``: one source of truth.

Nothing here imports Airflow (the providers manager calls this while it starts up).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

PACKAGE = "exactly-once-airflow"
LEASE_STORE_CONN_TYPE = "exactly_once_lease_store"

_TYPES = {bool: "boolean", int: "integer", float: "float", str: "string"}


def _version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:  # imported from a source tree that is not installed
        return "0.0.0"


def _option(
    description: str, kind: type, default: str, example: str, sensitive: bool
) -> dict[str, Any]:
    return {
        "description": description,
        "version_added": None,
        "type": _TYPES[kind],
        "example": example or None,
        "default": default,
        "sensitive": sensitive,
    }


def config_sections() -> dict[str, Any]:
    """The ``config`` part of the provider info: both sections, every declared option."""
    from airflow_plugins.protection import config
    from bridge import config as bridge_config

    return {
        config.SECTION: {
            "description": (
                "The exactly-once plugin: the lease store, lease timing and the cluster "
                "policy's opt-in tag. Each option can also be set as "
                "AIRFLOW__EXACTLY_ONCE__<OPTION>."
            ),
            "options": {
                o.name: _option(o.description, o.type, o.default, o.example, o.sensitive)
                for o in config.OPTIONS.values()
            },
        },
        "bridge": {
            "description": (
                "The Airflow -> Temporal migration bridge. An environment variable "
                "(named in each option's description) wins over the option."
            ),
            "options": {
                s.option: _option(
                    f"{s.description} (environment: {s.env})",
                    s.type,
                    s.default,
                    s.example,
                    s.sensitive,
                )
                for s in bridge_config.SETTINGS
            },
        },
    }


def get_provider_info() -> dict[str, Any]:
    """The provider info Airflow's providers manager reads (``provider_info.schema.json``)."""
    return {
        "package-name": PACKAGE,
        "name": "Exactly-once",
        "description": (
            "Postgres run-leases with fencing tokens for exactly-once business effects, "
            "and a migration bridge to Temporal."
        ),
        "versions": [_version()],
        "connection-types": [
            {
                "connection-type": LEASE_STORE_CONN_TYPE,
                "hook-class-name": "airflow_plugins.protection.lease_store_hook.LeaseStoreHook",
                "hook-name": "Exactly-once lease store (Postgres)",
            }
        ],
        "plugins": [
            {
                "name": "exactly_once",
                "plugin-class": "airflow_plugins.protection.plugin.ExactlyOncePlugin",
            }
        ],
        "config": config_sections(),
    }
