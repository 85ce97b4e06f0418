"""An auth manager with per-DAG read grants, for the views tests (SimpleAuthManager has none).

The user ``restricted`` (role viewer) may read only ``compliance_minutely``; every other user is
as SimpleAuthManager decides. The api-server of tests/views/conftest.py runs with it.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

GRANTS = {"restricted": frozenset({"compliance_minutely"})}


class GrantingAuthManager(SimpleAuthManager):
    """SimpleAuthManager with per-DAG grants for the users in ``GRANTS``."""

    def is_authorized_dag(
        self,
        *,
        method: Any,
        user: Any,
        access_entity: Any = None,
        details: Any = None,
    ) -> bool:
        """A granted user may read its DAGs only (and not all DAGs); others as Simple decides."""
        granted = GRANTS.get(user.get_name())
        if granted is None:
            return bool(
                super().is_authorized_dag(
                    method=method, user=user, access_entity=access_entity, details=details
                )
            )
        return method == "GET" and details is not None and details.id in granted
