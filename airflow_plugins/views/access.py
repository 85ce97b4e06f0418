"""Who may see the pages and who may change things: Airflow's own auth manager decides.

Every route depends on ``GetUserDep`` (a request without Airflow's JWT, in the UI's cookie or a
bearer header, gets 401). Changing a cutover mode, force-releasing a lease and approving a
re-run need an administrator: a user the auth manager lets change Airflow's configuration
(SimpleAuthManager: the op and admin roles; FAB: Admin) and edit the DAG concerned; others
get 403. Changes must come from the same origin (the session cookie is SameSite=lax too).
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request, status


def is_admin(user: Any, dag_id: str | None = None) -> bool:
    """Whether ``user`` may make administrative changes (for ``dag_id`` if given)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        ConfigurationDetails,
        DagDetails,
    )

    manager = get_auth_manager()
    if not manager.is_authorized_configuration(
        method="PUT", details=ConfigurationDetails(section="exactly_once"), user=user
    ):
        return False
    if dag_id is None:
        return True
    return bool(manager.is_authorized_dag(method="PUT", details=DagDetails(id=dag_id), user=user))


def actor_name(user: Any) -> str:
    """The name recorded as the actor of a change."""
    return str(user.get_name())


def same_origin(request: Request) -> None:
    """Refuses a change posted from another site (403)."""
    origin = request.headers.get("origin")
    if origin and origin.split("://", 1)[-1].rstrip("/") != request.headers.get("host", ""):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "cross-origin change refused")


def require_admin(request: Request, user: Any, dag_id: str | None = None) -> str:
    """Checks an administrative change; returns the actor name.

    Raises:
        HTTPException: 403 for a non-admin or a cross-origin post.
    """
    same_origin(request)
    if not is_admin(user, dag_id):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this change needs an administrator (Airflow: may edit the configuration)",
        )
    return actor_name(user)
