"""The hook behind the ``exactly_once_lease_store`` connection type.

The lease store is a Postgres database; a Connection of type ``postgres`` works as well. This
type exists so the Connections form names the lease store and its fields, and so the provider
declares the connection it needs (``airflow_plugins.provider_info``).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_plugins.lease import LeaseStore


class LeaseStoreHook(BaseHook):
    """A lease store reached through an Airflow Connection (host, port, login, database).

    Args:
        lease_conn_id: the Connection's id (default ``exactly_once_leases``, the plugin's
            ``[exactly_once] lease_conn_id`` default).
    """

    conn_name_attr = "lease_conn_id"
    default_conn_name = "exactly_once_leases"
    conn_type = "exactly_once_lease_store"
    hook_name = "Exactly-once lease store (Postgres)"

    def __init__(self, lease_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lease_conn_id = lease_conn_id

    def get_dsn(self) -> str:
        """The libpq DSN of the Connection."""
        from airflow_plugins.protection.config import dsn_of_connection

        return dsn_of_connection(self.get_connection(self.lease_conn_id))

    def get_conn(self) -> LeaseStore:
        """A lease store on the Connection (close it, or use it as a context manager)."""
        return LeaseStore(self.get_dsn())

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The Connections form: the Postgres fields, named for the lease store."""
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database"},
            "placeholders": {"host": "leases-db", "port": "5432", "schema": "leases"},
        }
