"""The plugin's pages in the Airflow UI: leases, audit, runs (gaps and SLA) and migration.

``create_app()`` builds the FastAPI app the plugin mounts under ``fastapi_apps`` at
``/exactly-once``. Every route depends on Airflow's authentication (401 without it); changes
(force-release, approve a re-run, change a cutover mode) need an administrator (403 otherwise),
and each is made through the lease store's or the bridge's audited functions with the user as
actor and a reason. Every page shows only the DAGs the user may read, reads a bounded number
of rows, and refuses what is out of range with a 4xx; an error never shows the store's own
message (its host, port and user), which is logged for the operator instead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import psycopg
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, FastAPI, Form, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from airflow_plugins.lease import InvalidLeaseInput, LeaseStore, LeaseStoreUnavailable, check_key
from airflow_plugins.views import access, pages
from airflow_plugins.views.audit_answer import describe_holder
from airflow_plugins.views.pages import DagSource

log = logging.getLogger(__name__)
MAX_ROWS = 500
MAX_AUDIT_ROWS = 2000
MAX_DAYS = 400
# a business period starts with its year: 2024, 2024-Q1, 2024-W07, 2024-02-15, 2024-02-15T03
PERIOD = r"^[0-9]{4}[0-9A-Za-z:+\-]*$"
# the range of moments a page accepts: far enough from datetime's ends that no step overflows
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


@functools.cache
def _templates() -> Environment:
    env = Environment(
        loader=PackageLoader("airflow_plugins.views", "templates"),
        autoescape=select_autoescape(["html"]),
    )
    env.filters["when"] = _when
    env.filters["jsonish"] = _jsonish
    env.filters["describe_holder"] = describe_holder
    return env


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "-" if value is None else str(value)


def _jsonish(value: Any) -> str:
    import json

    if value is None:
        return "-"
    return json.dumps(value, default=str, sort_keys=True)[:2000]


def _default_store() -> LeaseStore:
    from airflow_plugins.watcher.settings import lease_store_dsn

    return LeaseStore(lease_store_dsn(), connect_timeout=3.0)


def _default_dags(now: datetime) -> list[Any]:
    from airflow_plugins.watcher.dags import protected_dags

    return list(protected_dags(now))


def _ready_after() -> int:
    try:
        from bridge.config import BridgeConfig

        return BridgeConfig.load().ready_after
    except Exception:  # the bridge is optional for these pages; its default then
        return 5


def create_app(
    store: Callable[[], LeaseStore] | None = None,
    dags: DagSource | None = None,
) -> FastAPI:
    """Builds the pages app.

    Args:
        store: returns the lease store (default: the configured one, opened on first use).
        dags: returns the watched DAGs (default: protected DAGs from Airflow's metadata DB).
    """
    app = FastAPI(title="Exactly-once", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.lease_store = functools.cache(store or _default_store)
    app.state.watched_dags = dags or _default_dags
    app.add_exception_handler(LeaseStoreUnavailable, _unavailable)
    app.add_exception_handler(psycopg.Error, _unavailable)
    app.include_router(router)
    return app


def _store(request: Request) -> LeaseStore:
    got: LeaseStore = request.app.state.lease_store()
    return got


def _dags(request: Request) -> DagSource:
    got: DagSource = request.app.state.watched_dags
    return got


async def _unavailable(request: Request, exc: Exception) -> Response:
    # the store's message names its host, port and user: for the operator's log, not the page
    log.error("lease store error on %s: %s", request.url.path, exc)
    return JSONResponse(
        {"detail": "the lease store is unavailable; try again later (details in the log)"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
    )


def render(request: Request, name: str, user: Any, **context: Any) -> HTMLResponse:
    """Renders a page template with the navigation's context."""
    html = (
        _templates()
        .get_template(name)
        .render(
            request=request,
            base=str(request.scope.get("root_path", "")),
            user=access.actor_name(user),
            admin=access.is_admin(user),
            now=datetime.now(UTC),
            here=name.removesuffix(".html"),
            **context,
        )
    )
    return HTMLResponse(html)


router = APIRouter()


@router.get("/", include_in_schema=False)
def index(request: Request, user: GetUserDep) -> RedirectResponse:
    return RedirectResponse(str(request.scope.get("root_path", "")) + "/leases")


@router.get("/leases", response_class=HTMLResponse)
def leases(
    request: Request,
    user: GetUserDep,
    prefix: Annotated[str | None, Query(max_length=512)] = None,
    state: Annotated[str | None, Query(pattern="^(running|succeeded|failed|released)$")] = None,
    expired: bool = False,
    taken_over: bool = False,
    hours: Annotated[int, Query(ge=1, le=168)] = 24,
    limit: Annotated[int, Query(ge=1, le=MAX_ROWS)] = 100,
    message: str | None = None,
) -> HTMLResponse:
    data = pages.leases_page(
        _store(request),
        prefix=prefix or None,
        state=state or None,
        expired_only=expired,
        taken_over_only=taken_over,
        hours=hours,
        limit=limit,
        dags=access.readable_dags(user),
    )
    filters = {
        "prefix": prefix or "",
        "state": state or "",
        "expired": expired,
        "taken_over": taken_over,
        "hours": hours,
        "limit": limit,
    }
    return render(request, "leases.html", user, page=data, filters=filters, message=message)


@router.get("/audit", response_class=HTMLResponse)
def audit(
    request: Request,
    user: GetUserDep,
    dag_id: Annotated[str | None, Query(max_length=250, pattern=r"^[A-Za-z0-9_.\-]*$")] = None,
    business_date: Annotated[str | None, Query(max_length=40, pattern=f"{PERIOD}|^$")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_ROWS)] = 500,
) -> HTMLResponse:
    result = chart = None
    if dag_id and business_date:
        access.require_read(user, dag_id)
        result, chart = pages.audit_page(_store(request), dag_id, business_date, limit)
    return render(
        request,
        "audit.html",
        user,
        dag_id=dag_id or "",
        business_date=business_date or "",
        result=result,
        chart=chart,
    )


@router.get("/api/audit")
def audit_json(
    request: Request,
    user: GetUserDep,
    dag_id: Annotated[str, Query(max_length=250, pattern=r"^[A-Za-z0-9_.\-]+$")],
    business_date: Annotated[str, Query(max_length=40, pattern=PERIOD)],
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_ROWS)] = MAX_AUDIT_ROWS,
) -> dict[str, Any]:
    access.require_read(user, dag_id)
    result, _ = pages.audit_page(_store(request), dag_id, business_date, limit)
    return {
        "dag_id": dag_id,
        "business_date": business_date,
        # more audit rows than the limit: narrow the period (2024-02-15T03) or raise the limit
        "truncated": sum(len(k.rows) for k in result.keys) + len(result.run_events) >= limit,
        "verdict": result.verdict.value,
        "keys": [
            {
                "key": k.key,
                "verdict": k.verdict.value,
                "completions": k.completions,
                "blocked": k.blocked,
                "tries": [
                    {
                        "token": t.token,
                        "holder": t.holder,
                        "outcome": t.outcome,
                        "duration_ms": t.duration_ms,
                    }
                    for t in k.tries
                ],
            }
            for k in result.keys
        ],
    }


@router.get("/runs", response_class=HTMLResponse)
def runs(
    request: Request,
    user: GetUserDep,
    dag_id: Annotated[str | None, Query(max_length=250)] = None,
    since: Annotated[str | None, Query(max_length=40)] = None,
    until: Annotated[str | None, Query(max_length=40)] = None,
) -> HTMLResponse:
    end = _moment(until) if until else datetime.now(UTC)
    start = _moment(since) if since else end - timedelta(days=1)
    if end < start:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "since must be before until")
    if end - start > timedelta(days=MAX_DAYS):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"at most {MAX_DAYS} days at a time")
    if dag_id:
        access.require_read(user, dag_id)
    data = pages.runs_page(
        _store(request),
        _dags(request),
        dag_id=dag_id or None,
        since=start,
        until=end,
        readable_dags=access.readable_dags(user),
    )
    return render(
        request,
        "runs.html",
        user,
        page=data,
        dag_id=dag_id or "",
        since=start.strftime("%Y-%m-%dT%H:%M"),
        until=end.strftime("%Y-%m-%dT%H:%M"),
        more_since=data.more_since.isoformat() if data.more_since else "",
    )


@router.get("/migration", response_class=HTMLResponse)
def migration(
    request: Request,
    user: GetUserDep,
    days: Annotated[int, Query(ge=1, le=31)] = 2,
    message: str | None = None,
) -> HTMLResponse:
    dags_, modes = pages.migration_page(
        _store(request),
        _dags(request),
        ready_after=_ready_after(),
        days=days,
        readable_dags=access.readable_dags(user),
    )
    return render(request, "migration.html", user, dags=dags_, modes=modes, message=message)


@router.get("/handover", response_class=HTMLResponse)
def handover(
    request: Request,
    user: GetUserDep,
    dag_id: Annotated[str, Query(max_length=250, pattern=r"^[A-Za-z0-9_.\-]+$")],
    run_id: Annotated[str, Query(min_length=1, max_length=250)],
) -> HTMLResponse:
    """A DAG run's work handed to Temporal, task by task (the DAG run's "Temporal tasks")."""
    access.require_read(user, dag_id)
    from airflow_plugins.views.handover import handover_page

    data = handover_page(dag_id, run_id)
    answer = render(request, "handover.html", user, page=data, dag_id=dag_id, run_id=run_id)
    if data.unavailable:
        answer.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return answer


@router.post("/leases/force-release")
def force_release(
    request: Request,
    user: GetUserDep,
    key: Annotated[str, Form()],
    reason: Annotated[str, Form()],
) -> RedirectResponse:
    actor = access.require_admin(request, user, _dag_of(key))
    with _refused_as(status.HTTP_400_BAD_REQUEST):
        token = _store(request).force_release(key, actor=actor, reason=reason)
    said = f"released {key} (token {token})" if token else f"{key} was not running"
    return _back(request, "leases", said)


@router.post("/leases/approve-rerun")
def approve_rerun(
    request: Request,
    user: GetUserDep,
    key: Annotated[str, Form()],
    reason: Annotated[str, Form()],
) -> RedirectResponse:
    actor = access.require_admin(request, user, _dag_of(key))
    with _refused_as(status.HTTP_400_BAD_REQUEST):
        outcome = _store(request).approve_rerun(key, actor=actor, reason=reason)
    return _back(request, "leases", f"re-run of {key}: {outcome}")


@router.post("/migration/mode")
def change_mode(
    request: Request,
    user: GetUserDep,
    dag_id: Annotated[str, Form(max_length=250, pattern=r"^[A-Za-z0-9_.\-]+$")],
    mode: Annotated[str, Form()],
    reason: Annotated[str, Form()],
    force: Annotated[bool, Form()] = False,
) -> RedirectResponse:
    actor = access.require_admin(request, user, dag_id)
    from airflow_plugins.watcher.settings import lease_store_dsn
    from bridge.comparison import readiness
    from bridge.cutover import CutoverMode, ModeStore
    from bridge.in_airflow import cli_child, shadow_check

    store = _store(request)
    with _refused_as(status.HTTP_409_CONFLICT):
        target = CutoverMode.parse(mode)
        modes = ModeStore(store)
        if CutoverMode.TEMPORAL_SCHEDULED in (target, modes.get(dag_id)):
            # the Temporal Schedule created or deleted and the Airflow DAG paused or unpaused,
            # as `bridge mode set` does it, in a child process (no temporalio in the api-server)
            before, after, warning = cli_child.set_mode_in_child(
                dag_id,
                target.value,
                actor=actor,
                reason=reason,
                force=force,
                folder=shadow_check.dags_folder(),
                lease_dsn=lease_store_dsn(),
                mode_now=lambda: modes.get(dag_id).value,
            )
            said = f"{dag_id}: {before} -> {after}" + (f" (warning: {warning})" if warning else "")
            return _back(request, "migration", said)
        # the same gate as `bridge mode set DAG shadow` (also skipped by force), run on the DAG
        # folder in a child process: DAG code never runs in the api-server
        if target is CutoverMode.SHADOW and not force:
            shadow_check.check_in_child(dag_id, shadow_check.dags_folder())
        verdict = readiness(store, dag_id, _ready_after())
        change = modes.set(
            dag_id,
            mode,
            actor=actor,
            reason=reason,
            force=force,
            ready=verdict.ready,
            why_not_ready=verdict.why_not(),
        )
    said = f"{dag_id}: {change.previous.value} -> {change.current.value}"
    return _back(request, "migration", said)


@contextmanager
def _refused_as(code: int) -> Iterator[None]:
    """Answers a change the lease store refused (bad input, wrong state) with ``code``."""
    try:
        yield
    except InvalidLeaseInput as exc:
        raise HTTPException(code, str(exc)) from exc


def _dag_of(key: str) -> str:
    with _refused_as(status.HTTP_400_BAD_REQUEST):
        return check_key(key).split("/", 1)[0]


def _back(request: Request, page: str, message: str) -> RedirectResponse:
    from urllib.parse import urlencode

    url = f"{request.scope.get('root_path', '')}/{page}?{urlencode({'message': message})}"
    return RedirectResponse(url, status_code=status.HTTP_303_SEE_OTHER)


def _moment(text: str) -> datetime:
    """A moment of a query parameter, between ``EARLIEST`` and ``LATEST`` (400 otherwise)."""
    try:
        moment = datetime.fromisoformat(text)
        moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        if not EARLIEST <= moment <= LATEST:
            raise ValueError("out of range")
    except (ValueError, OverflowError) as exc:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"not a date/time between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}: {text[:40]!r}",
        ) from exc
    return moment
