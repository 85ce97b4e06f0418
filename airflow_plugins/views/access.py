"""Who may see the pages and who may change things: Airflow's own auth manager decides.

Every route depends on ``GetUserDep`` (a request without Airflow's JWT, in the UI's cookie or a
bearer header, gets 401). Changing a cutover mode, force-releasing a lease and approving a
re-run need an administrator: a user the auth manager lets change Airflow's configuration
(SimpleAuthManager: the op and admin roles; FAB: Admin) and edit the DAG concerned; others
get 403. Reading needs read access to the DAG (``readable_dags``: every page shows only the
keys of the DAGs the auth manager lets the user read, as Airflow's own lists do).

Changes must come from Airflow's own origin, the scheme, host and port of ``[api] base_url`` (not
the Host header, which a proxy may rewrite): a change with another ``Origin``, or with none and
a ``Referer`` of another origin, is refused; a change carrying neither is refused unless it is
authenticated by a bearer header (which a browser never adds on its own: Airflow's JWT
convention for API clients). The session cookie is SameSite=lax too.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

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


def readable_dags(user: Any) -> frozenset[str] | None:
    """The DAG ids ``user`` may read, or None when the user may read every DAG.

    Asks the auth manager as Airflow's DAG lists do: read access to all DAGs first, else the
    DAGs it grants one by one (``get_authorized_dag_ids``, over the DAGs Airflow knows).
    """
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    if manager.is_authorized_dag(method="GET", user=user):
        return None
    return frozenset(manager.get_authorized_dag_ids(user=user, method="GET"))


def require_read(user: Any, dag_id: str) -> None:
    """Refuses (403) a page of a DAG the user may not read."""
    readable = readable_dags(user)
    if readable is not None and dag_id not in readable:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"no read access to DAG {dag_id!r}")


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        return None
    port = parts.port
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    host = (parts.hostname or "").lower()
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port and port != default else "")


def expected_origin(request: Request) -> str:
    """Airflow's origin: from ``[api] base_url``, else the URL this request reached."""
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="") or str(request.base_url)
    origin = _origin_of(base)
    if origin is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "[api] base_url is not a URL")
    return origin


def same_origin(request: Request) -> None:
    """Refuses a change posted from another site (403)."""
    expected = expected_origin(request)
    origin = request.headers.get("origin")
    referer = request.headers.get("referer")
    if origin is not None:
        seen = _origin_of(origin)
    elif referer:
        seen = _origin_of(referer)
    elif request.headers.get("authorization", "").lower().startswith("bearer "):
        return  # an API client's bearer token: no browser sends it cross-site
    else:
        seen = None
    if seen != expected:
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
