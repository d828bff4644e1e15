"""The middleware every dashboard request passes, in order: the ``Host`` allow-list (421,
or 400 without a usable Host: DNS rebinding), the cross-site check of a POST (403), the
login throttle (429), authentication (401); and on the way out the security headers on
every response, an unexpected error's 500 included (logged, never its text).
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from leaseq.web.security import (
    SECURITY_HEADERS,
    AuthHook,
    HostPolicy,
    Throttle,
    cross_site,
    host_name,
    resolve_user,
)

log = logging.getLogger("leaseq.web")


def is_tls(scope: Scope, trust_forwarded: bool) -> bool:
    """Did the request come over TLS? The connection's scheme, or, only when the app is
    told to trust its proxy, X-Forwarded-Proto / Forwarded proto=https."""
    if scope.get("scheme") == "https":
        return True
    if not trust_forwarded:
        return False
    headers = Request(scope).headers
    proto = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    forwarded = headers.get("forwarded", "").split(",")[0].lower().replace(" ", "")
    return proto == "https" or "proto=https" in forwarded.split(";")


def client_address(scope: Scope, trust_forwarded: bool) -> str:
    """Whom the login throttle counts: the peer, or the proxy's X-Forwarded-For when
    trusted (its last entry: the one the proxy added)."""
    if trust_forwarded:
        forwarded = Request(scope).headers.get("x-forwarded-for", "")
        if forwarded.strip():
            return forwarded.split(",")[-1].strip()[:100]
    peer = scope.get("client")
    return str(peer[0]) if peer else "unknown"


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: AuthHook | None,
        challenge: bool,
        hosts: HostPolicy,
        throttle: Throttle,
        trust_forwarded: bool,
    ) -> None:
        self.app = app
        self.auth = auth
        self.challenge = challenge
        self.hosts = hosts
        self.throttle = throttle
        self.trust_forwarded = trust_forwarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.lower().encode() not in present:
                        headers.append((name.lower().encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        async def refuse(text: str, status: int, headers: dict[str, str] | None = None) -> None:
            await PlainTextResponse(text + "\n", status, headers=headers)(
                scope, receive, send_with_headers
            )

        try:
            request = Request(scope)
            host = request.headers.get("host")
            if not self.hosts.allows(host):
                if host_name(host) is None:
                    await refuse("a request needs a valid Host header", 400)
                else:
                    await refuse("this dashboard does not answer to that host name", 421)
                return
            scheme = "https" if is_tls(scope, self.trust_forwarded) else "http"
            why = cross_site(request.method, request.headers, scheme)
            if why is not None:
                await refuse(why, 403)
                return
            if self.auth is not None:
                client = client_address(scope, self.trust_forwarded)
                wait = self.throttle.retry_after(client)
                if wait is not None:
                    retry = {"Retry-After": str(int(wait) + 1)}
                    await refuse("too many failed logins: try again later", 429, retry)
                    return
            user = await resolve_user(self.auth, request)
            if user is None:
                if "authorization" in request.headers:
                    self.throttle.failed(client)
                challenge = {"WWW-Authenticate": 'Basic realm="leaseq"'} if self.challenge else {}
                await refuse("authentication required", 401, challenge)
                return
            if self.auth is not None:
                self.throttle.succeeded(client)
            scope["leaseq_user"] = user
            scope["leaseq_tls"] = scheme == "https"
            await self.app(scope, receive, send_with_headers)
        except Exception:
            log.exception("dashboard error on %s", scope.get("path"))
            if not started:
                await refuse("internal error (logged on the server)", 500)
