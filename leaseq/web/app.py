"""``create_app``: the dashboard as one Starlette app, with its routes, the guard every
request passes (``guard.py``: Host allow-list, cross-site POSTs, login throttle,
authentication, the security headers on every response, errors included) and the mapping of
a timed-out or unreachable database to a page, never a 500 (and never PostgreSQL's text).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import psycopg
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from leaseq.client_async import AsyncClient
from leaseq.errors import DatabaseUnavailable, LeaseqError
from leaseq.web.actions import Actions, RefusalPage
from leaseq.web.bulk import BulkActions
from leaseq.web.context import HERE, Web, make_templates
from leaseq.web.extras import extra_routes, render_extra
from leaseq.web.fair_pages import FairPages
from leaseq.web.guard import Guard
from leaseq.web.ops_pages import OpsPages
from leaseq.web.pages import Pages
from leaseq.web.schedules import SchedulePages
from leaseq.web.security import (
    LOOPBACK_NAMES,
    AuthHook,
    AuthorizeHook,
    Csrf,
    HostPolicy,
    Throttle,
    check_base_path,
)


def _problem(request: Request, exc: Exception) -> Response:
    if isinstance(exc, psycopg.errors.QueryCanceled):
        text = "the database took longer than the dashboard's statement timeout; narrow the filter"
        return PlainTextResponse(text + "\n", 503)
    if isinstance(exc, DatabaseUnavailable | psycopg.OperationalError):
        return PlainTextResponse("database unavailable (the server's log says why)\n", 503)
    if isinstance(exc, psycopg.Error):
        # PostgreSQL's text names tables and values: it stays out of the response.
        return PlainTextResponse("the database refused this request\n", 400)
    return PlainTextResponse(f"{exc}\n", 400)


def create_app(
    client: AsyncClient,
    *,
    auth: AuthHook | None = None,
    authorize: AuthorizeHook | None = None,
    read_only: bool = False,
    base_path: str = "",
    csrf_secret: bytes | None = None,
    close_client: bool = False,
    allowed_hosts: Sequence[str] | None = None,
    trust_forwarded: bool = False,
    throttle: Throttle | None = None,
    csrf_ttl: float = 8 * 3600,
) -> Starlette:
    """The dashboard over ``client``'s schema, as an ASGI app to run or mount.

    ``auth(request)`` returns the user (any value; its text is the audit trail's actor) or
    None to refuse the request with 401; it may be async (see
    :class:`leaseq.web.BasicAuth`). Without it every request is served as "local":
    only do that on loopback. ``authorize(user, action)`` decides each action (replay,
    purge, cancel, skip, pause, resume). ``read_only`` hides and refuses all of them.
    ``base_path`` is the prefix a reverse proxy strips (links are written with it).
    ``close_client`` closes the client when the app shuts down.

    ``allowed_hosts``: the ``Host`` names (and addresses) requests may carry; anything else
    is refused (421), which is what stops DNS rebinding. ``0.0.0.0`` / ``::`` admit any IP
    literal, ``*`` anything. The default: loopback names only without ``auth``, anything
    with it. ``csrf_secret`` (at least 16 bytes; LEASEQ_WEB_SECRET for the CLI) signs the
    session-bound CSRF tokens, valid ``csrf_ttl`` seconds: give replicas the same one.
    ``trust_forwarded`` trusts X-Forwarded-Proto/-For from a TLS proxy (Secure cookies,
    the login throttle's client). ``throttle`` bounds failed logins (10 a minute per client
    by default).
    """
    if not isinstance(client, AsyncClient):
        raise TypeError("create_app needs a leaseq.AsyncClient (the dashboard is async)")
    web = Web(
        client=client,
        templates=make_templates(),
        csrf=Csrf(csrf_secret, ttl=csrf_ttl),
        auth=auth,
        authorize=authorize,
        read_only=read_only,
        base_path=check_base_path(base_path),
        trust_forwarded=trust_forwarded,
    )
    if allowed_hosts is None:
        allowed_hosts = LOOPBACK_NAMES if auth is None else ["*"]
    pages = Pages(web)
    fair = FairPages(web)
    ops = OpsPages(web)
    bulk = BulkActions(web)
    actions = Actions(web, pages)

    async def job_refusal(request: Request, form: FormData, error: str, status: int) -> Response:
        return await pages.job_page(request, error=error, status=status)

    async def dead_refusal(request: Request, form: FormData, error: str, status: int) -> Response:
        return await pages.dead_page(request, form, error=error, status=status)

    async def keys_refusal(request: Request, form: FormData, error: str, status: int) -> Response:
        return await pages.keys_page(request, error=error, status=status)

    async def pauses_refusal(request: Request, form: FormData, error: str, status: int) -> Response:
        return await pages.pauses_page(request, error=error, status=status)

    async def jobs_refusal(request: Request, form: FormData, error: str, status: int) -> Response:
        return await pages.jobs_page(request, error=error, status=status)

    async def limits_refusal(request: Request, form: FormData, error: str, status: int) -> Response:
        return await render_extra(web, request, "limits", error=error, status=status)

    def post(path: str, action: str, handler: Any, page: RefusalPage) -> Route:
        endpoint: Callable[[Request], Awaitable[Response]] = actions.guarded(action, handler, page)
        return Route(path, endpoint, methods=["POST"])

    schedule_routes: list[Route] = []
    if callable(getattr(client, "schedules", None)):
        sp = SchedulePages(web)
        schedule_routes = [
            Route("/schedules", sp.page),
            post("/schedules/{name}/run", "schedule", sp.run_now, sp.refusal),
            post("/schedules/{name}/enable", "schedule", sp.enable, sp.refusal),
            post("/schedules/{name}/disable", "schedule", sp.disable, sp.refusal),
        ]
    limit_routes: list[Route] = []
    if callable(getattr(client, "set_limit", None)):
        limit_routes = [post("/limits/set", "limit", bulk.set_limit, limits_refusal)]
    routes = [
        Route("/", pages.overview),
        Route("/partials/overview", pages.overview_fragment),
        Route("/queues/{name}", pages.queue),
        Route("/queues/{name}/keys", fair.page),
        post("/queues/{name}/keys/weight", "weight", fair.set_weight, fair.refusal),
        Route("/jobs", pages.jobs),
        Route("/jobs/{job_id}", pages.job),
        Route("/dead", pages.dead),
        Route("/dead/groups", ops.dead_groups),
        Route("/workers", ops.workers),
        Route("/tasks", ops.tasks),
        Route("/find", ops.find),
        Route("/keys", pages.keys),
        Route("/pauses", pages.pauses),
        post("/jobs/bulk", "bulk", bulk.jobs, jobs_refusal),
        post("/jobs/{job_id}/replay", "replay", actions.replay, job_refusal),
        post("/jobs/{job_id}/delete", "purge", bulk.delete_one, job_refusal),
        post("/jobs/{job_id}/run", "run", bulk.run_now, job_refusal),
        post("/jobs/{job_id}/cancel", "cancel", actions.cancel, job_refusal),
        post("/dead/replay", "replay", actions.dead_bulk, dead_refusal),
        post("/dead/purge", "purge", actions.dead_bulk, dead_refusal),
        post("/keys/{job_id}/skip", "skip", actions.skip, keys_refusal),
        post("/pauses/pause", "pause", actions.pause, pauses_refusal),
        post("/pauses/resume", "resume", actions.resume, pauses_refusal),
        *schedule_routes,
        *limit_routes,
        *extra_routes(web),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if close_client:
            await client.close()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            LeaseqError: _problem,
            psycopg.Error: _problem,
        },
    )
    app.add_middleware(
        Guard,
        auth=auth,
        challenge=bool(getattr(auth, "challenge", False)),
        hosts=HostPolicy(allowed_hosts),
        throttle=throttle or Throttle(),
        trust_forwarded=trust_forwarded,
    )
    app.state.web = web
    return app
