"""The HTTP API (docs/http-api.md): JSON endpoints under ``/api/v1/`` as a Starlette app of
its own, served by ``leaseq web`` beside the dashboard (or alone, ``--api-only``).

Every request passes the dashboard's guard (Host allow-list, cross-site check of a POST,
failed-login throttle, the security headers) with bearer tokens (``leaseq tokens
create``) as its authentication; each endpoint then checks the token's scope and queues,
reads a body of at most :data:`MAX_BODY` bytes, and every answer given to a token is
recorded in ``api_requests`` with the token's name as actor (the audited operations it
calls, cancel, replay and signal, name it too). Errors are JSON: ``{"error": one line, "code":
the SQLSTATE the SQL API would give, when there is one}``. The OpenAPI document is
``openapi.json`` beside this file, served at ``/api/v1/openapi.json``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from leaseq.client_async import AsyncClient
from leaseq.errors import (
    SQLSTATES,
    ConfigError,
    InvalidTransition,
    JobFailed,
    JobNotFound,
    LeaseqError,
    ResultTimeout,
    UniqueConflict,
)
from leaseq.models import QueueScaling
from leaseq.rules.tokens import ApiToken
from leaseq.web.guard import Guard
from leaseq.web.security import HostPolicy, Throttle

log = logging.getLogger("leaseq.web.api")

PREFIX = "/api/v1"
OPENAPI = Path(__file__).with_name("openapi.json")
#: The largest request body accepted (a bulk enqueue of small jobs, or one 1 MiB payload).
MAX_BODY = 2 * 1024 * 1024
#: The most jobs one bulk enqueue takes.
MAX_JOBS = 1000
#: The longest a GET of a job waits for its end (?wait=SECONDS).
MAX_WAIT = 30.0
#: WorkerConfig's default concurrency, which the view assumes for a queue without a setting.
DEFAULT_CONCURRENCY = 10
#: Who reads the OpenAPI document (it needs no token).
ANONYMOUS = "anonymous"
_CODES = {error: state for state, error in SQLSTATES.items()}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message.strip().splitlines()[0] if message else "error"}
    if code is not None:
        body["code"] = code
    return JSONResponse(body, status)


def _token(request: Request, scope: str, queue: str | None = None) -> ApiToken:
    token = request.scope.get("leaseq_user")
    if not isinstance(token, ApiToken):
        raise ApiError(401, "a bearer token is required")
    if not token.allows(scope, queue):
        where = f" on queue {queue!r}" if queue is not None else ""
        raise ApiError(403, f"token {token.name!r} may not {scope}{where}")
    return token


async def _body(request: Request) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise ApiError(413, f"the body is over {MAX_BODY} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, f"the body is over {MAX_BODY} bytes")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"null")
    except ValueError:
        raise ApiError(400, "the body is not JSON") from None


def _job_options(item: Any) -> dict[str, Any]:
    """One job of a request: enqueue's options as JSON, run_at and expires as ISO 8601."""
    if not isinstance(item, dict):
        raise ConfigError(f"a job is a JSON object, got {type(item).__name__}")
    job = dict(item)
    for name in ("run_at", "expires"):
        value = job.get(name)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                job[name] = dt.datetime.fromisoformat(value)
    return job


async def _job_id(request: Request) -> int:
    text = request.path_params["job_id"]
    if not text.isdigit() or len(text) > 19:
        raise ApiError(404, f"no job {text}")
    return int(text)


class Api:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def _visible_job(self, request: Request, job_id: int, scope: str) -> Any:
        """The job, when the token may act on its queue (else 404: no existence leaks)."""
        job = await self.client.get_job(job_id)
        token = _token(request, scope)
        if job is None or not token.allows(scope, job.queue):
            raise ApiError(404, f"no job {job_id}")
        return job

    async def enqueue(self, request: Request) -> Response:
        body = await _body(request)
        bulk = isinstance(body, dict) and set(body) == {"jobs"}
        items = body["jobs"] if bulk else [body]
        if not isinstance(items, list) or not items:
            raise ConfigError("jobs must be a non-empty JSON array of job objects")
        if len(items) > MAX_JOBS:
            raise ApiError(413, f"at most {MAX_JOBS} jobs per request")
        jobs = [_job_options(item) for item in items]
        token = _token(request, "enqueue")
        for job in jobs:
            _token(request, "enqueue", str(job.get("queue", "default")))
        results = await self.client.enqueue_many(jobs)
        request.scope["leaseq_detail"] = "jobs " + ",".join(str(int(r)) for r in results)[:3900]
        del token
        answers = [{"id": int(r), "inserted": r.inserted} for r in results]
        return JSONResponse({"jobs": answers} if bulk else answers[0], 201)

    async def job(self, request: Request) -> Response:
        job_id = await _job_id(request)
        wait_text = request.query_params.get("wait", "0")
        try:
            wait = float(wait_text)
        except ValueError:
            raise ConfigError(f"wait must be seconds, got {wait_text!r:.60}") from None
        if not 0 <= wait <= MAX_WAIT:
            raise ConfigError(f"wait must be between 0 and {MAX_WAIT:g} seconds, got {wait:g}")
        job = await self._visible_job(request, job_id, "read")
        if wait > 0 and job.status.value in ("pending", "running"):
            with contextlib.suppress(ResultTimeout, JobFailed, JobNotFound):
                await self.client.result(job_id, timeout=wait, poll_interval=0.5)
            job = await self._visible_job(request, job_id, "read")
        outcome = await self.client.job_result(job_id)
        return JSONResponse(
            {
                "job": job.as_dict(),
                "result": None
                if outcome is None
                else {"stored": outcome.stored, "value": outcome.value if outcome.stored else None},
            }
        )

    async def cancel(self, request: Request) -> Response:
        job_id = await _job_id(request)
        body = await _body(request)
        reason = body.get("reason") if isinstance(body, dict) else None
        await self._visible_job(request, job_id, "cancel")
        token = _token(request, "cancel")
        done = await self.client.cancel(job_id, actor=token.name, reason=reason)
        return JSONResponse({"id": job_id, "changed": done})

    async def replay(self, request: Request) -> Response:
        job_id = await _job_id(request)
        body = await _body(request)
        reason = body.get("reason") if isinstance(body, dict) else None
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("a replay needs a reason")
        await self._visible_job(request, job_id, "replay")
        token = _token(request, "replay")
        done = await self.client.replay(job_id, reason=reason, actor=token.name)
        return JSONResponse({"id": job_id, "changed": done})

    async def signal(self, request: Request) -> Response:
        """Client.signal: one delivery of the name (a durable job's ctx.wait_for)."""
        job_id = await _job_id(request)
        body = await _body(request)
        if not isinstance(body, dict) or "signal" not in body:
            raise ConfigError('a signal is {"signal": NAME, "payload": ...}')
        await self._visible_job(request, job_id, "signal")
        token = _token(request, "signal")
        stored = await self.client.signal(
            job_id, body["signal"], body.get("payload"), actor=token.name
        )
        return JSONResponse({"id": job_id, "stored": stored})

    async def queues(self, request: Request) -> Response:
        token = _token(request, "read")
        stats, _ = await self.client.web_overview()
        shown = [s.as_dict() for s in stats if token.allows("read", s.queue)]
        return JSONResponse({"queues": shown})

    async def autoscaling(self, request: Request) -> Response:
        token = _token(request, "read")
        rows = await self.client.web_autoscaling()
        return JSONResponse(
            {"queues": [r.as_dict() for r in rows if token.allows("read", r.queue)]}
        )

    async def autoscaling_queue(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        _token(request, "read", queue)
        rows = await self.client.web_autoscaling(queue)
        # A queue with nothing to do and no setting has no row: it needs no worker (an
        # autoscaler reads 0, not an error).
        row = (
            rows[0]
            if rows
            else QueueScaling(queue, 0, 0, 0.0, False, DEFAULT_CONCURRENCY, 0, None, None, 0)
        )
        return JSONResponse(row.as_dict())

    async def openapi(self, request: Request) -> Response:
        return Response(OPENAPI.read_bytes(), media_type="application/json")


#: (path, method, Api method name): the routes, which the OpenAPI document must match.
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("/jobs", "POST", "enqueue"),
    ("/jobs/{job_id}", "GET", "job"),
    ("/jobs/{job_id}/cancel", "POST", "cancel"),
    ("/jobs/{job_id}/replay", "POST", "replay"),
    ("/jobs/{job_id}/signal", "POST", "signal"),
    ("/queues", "GET", "queues"),
    ("/autoscaling", "GET", "autoscaling"),
    ("/autoscaling/{queue}", "GET", "autoscaling_queue"),
    ("/openapi.json", "GET", "openapi"),
)


def _problem(request: Request, exc: Exception) -> Response:
    if isinstance(exc, ApiError):
        return _error(exc.status, str(exc))
    if isinstance(exc, JobNotFound):
        return _error(404, str(exc))
    if isinstance(exc, UniqueConflict | InvalidTransition):
        return _error(409, str(exc), _CODES.get(type(exc)))
    if isinstance(exc, LeaseqError):
        code = next(
            (c for e, c in _CODES.items() if isinstance(exc, e) and e is not LeaseqError), None
        )
        status = 503 if type(exc).__name__ == "DatabaseUnavailable" else 400
        return _error(status, str(exc), code)
    log.warning("API request failed: %s", exc)
    return _error(503, "the database could not answer (the server's log says why)")


class BearerAuth:
    """The guard's authentication for the API: ``Authorization: Bearer TOKEN`` names a
    live token (None: 401). The OpenAPI document is served to anyone."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def __call__(self, request: Request) -> ApiToken | str | None:
        if request.url.path.endswith(PREFIX + "/openapi.json") and request.method == "GET":
            return ANONYMOUS
        kind, _, secret = request.headers.get("authorization", "").partition(" ")
        if kind.lower() != "bearer" or not secret.strip():
            return None
        return await self.client.token_for(secret.strip())


def _full_path(scope: Scope) -> str:
    """The request's path: Starlette's mounts keep it whole and set root_path (older
    versions strip it)."""
    root, path = str(scope.get("root_path", "")), str(scope["path"])
    return path if path.startswith(root) else root + path


class Audit:
    """One api_requests row per answer given to a token (the token's name as actor)."""

    def __init__(self, app: ASGIApp, client: AsyncClient) -> None:
        self.app = app
        self.client = client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            token = scope.get("leaseq_user")
            if isinstance(token, ApiToken):
                try:
                    await self.client.record_api_request(
                        token.name,
                        scope["method"],
                        _full_path(scope),
                        status,
                        scope.get("leaseq_detail"),
                    )
                except Exception as exc:  # the answer was given: log, never fail it
                    log.warning("could not record API request: %s", exc)


def create_api(
    client: AsyncClient,
    *,
    allowed_hosts: Sequence[str] | None = None,
    trust_forwarded: bool = False,
    throttle: Throttle | None = None,
    close_client: bool = False,
) -> Starlette:
    """The HTTP API over ``client``'s schema, to mount at ``/api/v1`` (``leaseq web`` does)
    or serve alone. ``allowed_hosts``: as the dashboard's; by default any, as the dashboard's
    with authentication (a browser never sends a bearer token by itself, so a rebound name
    gains nothing)."""
    api = Api(client)
    routes = [
        # A queue name may hold "/": the route takes the rest of the path.
        Route(path.replace("{queue}", "{queue:path}"), getattr(api, name), methods=[method])
        for path, method, name in ROUTES
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if close_client:
            await client.close()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: _problem, LeaseqError: _problem, psycopg.Error: _problem},
    )
    app.add_middleware(Audit, client=client)
    app.add_middleware(
        Guard,
        auth=BearerAuth(client),
        challenge=False,
        hosts=HostPolicy(allowed_hosts if allowed_hosts is not None else ["*"]),
        throttle=throttle or Throttle(),
        trust_forwarded=trust_forwarded,
    )
    return app


def with_api(
    dashboard: ASGIApp | None, api: Starlette, *, close_client: AsyncClient | None = None
) -> Starlette:
    """One app serving the API under /api/v1 and the dashboard (when given) beside it;
    ``close_client`` is closed when it shuts down (mounted apps' own lifespans do not run)."""
    routes: list[Mount] = [Mount(PREFIX, app=api)]
    if dashboard is not None:
        routes.append(Mount("", app=dashboard))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if close_client is not None:
            await close_client.close()

    return Starlette(routes=routes, lifespan=lifespan)
