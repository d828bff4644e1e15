"""The dashboard's security pieces: response headers (no framing, no sniffing, a strict
CSP), built-in HTTP basic auth compared in constant time, and the CSRF token.

CSRF is a signed double-submit token: the cookie holds ``nonce.signature`` (HMAC-SHA256 of
the nonce under a secret of the app), every form repeats it in a hidden field, and a POST is
accepted only when the field equals the cookie and the signature checks out. A page on
another site cannot read the cookie to copy it into its form, and a cookie planted by a
sibling domain fails the signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request

#: Who the request is from (None: not authenticated); may be a coroutine function.
AuthHook = Callable[[Request], Any]
#: May this user do this action ("replay", "purge", "cancel", "skip", "pause", "resume")?
AuthorizeHook = Callable[[Any, str], bool]

CSRF_COOKIE = "leaseq_csrf"
CSRF_FIELD = "csrf_token"

SECURITY_HEADERS: dict[str, str] = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    # No inline script or style at all: htmx is a static file configured by a meta tag.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "Cache-Control": "no-store",
}


class BasicAuth:
    """An ``auth`` hook accepting one user and password (HTTP basic auth), compared with
    :func:`hmac.compare_digest` so the time taken says nothing about either. A refused
    request gets the ``WWW-Authenticate`` challenge, so browsers ask for a login."""

    challenge = True

    def __init__(self, user: str, password: str) -> None:
        if not user or not password:
            raise ValueError("basic auth needs a user and a password")
        if ":" in user:
            raise ValueError("a basic auth user name cannot contain ':'")
        self.user = user
        self._user, self._password = user.encode(), password.encode()

    def __call__(self, request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            return None
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        got_user, sep, got_password = decoded.partition(b":")
        # Both comparisons always run: no early exit on a wrong user name.
        user_ok = hmac.compare_digest(got_user, self._user)
        password_ok = hmac.compare_digest(got_password, self._password)
        return self.user if sep and user_ok and password_ok else None


async def resolve_user(auth: AuthHook | None, request: Request) -> Any:
    """The authenticated user: the hook's answer, or "local" when there is no hook (the
    CLI then serves on loopback only)."""
    if auth is None:
        return "local"
    found = auth(request)
    if isinstance(found, Awaitable):
        found = await found
    return found


class Csrf:
    """Issues and checks the signed double-submit token."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or os.urandom(32)

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def valid(self, token: str | None) -> bool:
        """A token this app signed (whatever its cookie says)."""
        if not token or token.count(".") != 1 or len(token) > 200:
            return False
        nonce, signature = token.split(".")
        return hmac.compare_digest(signature, self._sign(nonce))

    def token_for(self, request: Request) -> tuple[str, bool]:
        """The token a page embeds: the request's cookie when valid, else a new one (and
        True: the response must set the cookie)."""
        cookie = request.cookies.get(CSRF_COOKIE)
        if self.valid(cookie):
            assert cookie is not None
            return cookie, False
        return self.issue(), True

    def check(self, request: Request, submitted: str | None) -> bool:
        """A POST's token: the form's field equals the cookie, and it is ours."""
        cookie = request.cookies.get(CSRF_COOKIE)
        if not cookie or not submitted or not self.valid(cookie):
            return False
        return hmac.compare_digest(cookie, submitted)
