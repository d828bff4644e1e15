"""The dashboard's security pieces, pure and small: the response headers (no framing, no
sniffing, a strict CSP), built-in HTTP basic auth compared in constant time, the CSRF token
bound to a session, the signed flash message of a POST-redirect-GET, the Host allow-list
(DNS rebinding), the cross-site check of a POST, the throttle of failed logins, and the
check of ``--base-path``. The middleware that applies them is ``guard.py``.

CSRF: every browser gets a random session id in an HttpOnly, SameSite=Strict cookie; a
form's token is ``issued.signature``, the HMAC-SHA256 (under the app's secret) of the
session id, the user and the time it was issued. A POST is accepted only with a token of
this session and user, younger than ``Csrf.ttl``. A page on another site can read neither
the cookie nor a token; a token leaked from one session is worthless in another, and an old
one expires. ``LEASEQ_WEB_SECRET`` gives replicas (and restarts) the same secret.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

#: Who the request is from (None: not authenticated); may be a coroutine function.
AuthHook = Callable[[Request], Any]
#: May this user do this action ("replay", "purge", "cancel", "skip", "pause", "resume")?
AuthorizeHook = Callable[[Any, str], bool]

SESSION_COOKIE = "leaseq_session"
FLASH_COOKIE = "leaseq_flash"
CSRF_FIELD = "csrf_token"
#: The shortest shared secret (LEASEQ_WEB_SECRET), in bytes.
MIN_SECRET = 16

SECURITY_HEADERS: dict[str, str] = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
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


def secret_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """LEASEQ_WEB_SECRET as bytes (None when unset); refused when shorter than 16 bytes."""
    value = (os.environ if environ is None else environ).get("LEASEQ_WEB_SECRET", "")
    if not value:
        return None
    raw = value.encode()
    if len(raw) < MIN_SECRET:
        raise ValueError(f"LEASEQ_WEB_SECRET must be at least {MIN_SECRET} bytes")
    return raw


class Csrf:
    """Issues and checks session-bound, expiring tokens; also signs flash messages."""

    def __init__(
        self,
        secret: bytes | None = None,
        *,
        ttl: float = 8 * 3600,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if secret is not None and len(secret) < MIN_SECRET:
            raise ValueError(f"the dashboard secret must be at least {MIN_SECRET} bytes")
        self._secret = secret or os.urandom(32)
        self.ttl = ttl
        self.clock = clock

    def _mac(self, *parts: str) -> str:
        text = "\x1f".join(parts)
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    @staticmethod
    def session_of(request: Request) -> str | None:
        value = request.cookies.get(SESSION_COOKIE)
        if value and 20 <= len(value) <= 64 and re.fullmatch(r"[A-Za-z0-9_-]+", value):
            return value
        return None

    def issue(self, session: str, user: object) -> str:
        issued = str(int(self.clock()))
        return f"{issued}.{self._mac('csrf', session, str(user), issued)}"

    def verdict(self, session: str | None, user: object, token: str | None) -> str | None:
        """None when ``token`` is this session's and user's and not expired; else why not."""
        if not session or not token or len(token) > 200 or token.count(".") != 1:
            return "the form did not come from this dashboard (CSRF check failed)"
        issued, signature = token.split(".")
        expected = self._mac("csrf", session, str(user), issued)
        if not issued.isdigit() or not hmac.compare_digest(signature, expected):
            return "the form did not come from this session (CSRF check failed)"
        age = self.clock() - int(issued)
        if age > self.ttl or age < -60:
            return "the form expired (CSRF check failed): reload the page and try again"
        return None

    def sign_flash(self, kind: str, text: str) -> str:
        body = base64.urlsafe_b64encode(json.dumps([kind, text[:1500]]).encode()).decode()
        return f"{body}.{self._mac('flash', body)}"

    def read_flash(self, value: str | None) -> tuple[str, str] | None:
        if not value or value.count(".") != 1 or len(value) > 4000:
            return None
        body, signature = value.split(".")
        if not hmac.compare_digest(signature, self._mac("flash", body)):
            return None
        try:
            kind, text = json.loads(base64.urlsafe_b64decode(body.encode()))
        except (ValueError, TypeError, binascii.Error):
            return None
        return (kind, text) if kind in ("ok", "error") and isinstance(text, str) else None


# -- Host allow-list and cross-site POSTs -------------------------------------------------

_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_name(header: str | None) -> str | None:
    """The name in a ``Host`` header without its port, lower case ("[::1]:80" -> "::1");
    None when it is missing or malformed."""
    if not header or len(header) > 300:
        return None
    value = header.strip().lower()
    if value.startswith("["):
        inside, sep, rest = value[1:].partition("]")
        if not sep or (rest and not re.fullmatch(r":\d{1,5}", rest)):
            return None
        try:
            return str(ipaddress.IPv6Address(inside))
        except ValueError:
            return None
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    name = name.rstrip(".")
    return name if _NAME.fullmatch(name) else None


class HostPolicy:
    """Which ``Host`` a request may name. Entries are host names or addresses; the wildcard
    addresses ``0.0.0.0`` and ``::`` (a server bound to every address) admit any IPv4 / any
    IP literal, which no DNS rebinding can produce; ``*`` admits anything."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.any = False
        self.any_v4 = self.any_ip = False
        self.names: set[str] = set()
        for entry in entries:
            value = entry.strip().lower()
            if value == "*":
                self.any = True
            elif value == "0.0.0.0":
                self.any_v4 = True
            elif value in ("::", "[::]"):
                self.any_ip = True
            else:
                bare_v6 = value.count(":") > 1 and not value.startswith("[")
                name = host_name(f"[{value}]" if bare_v6 else value)
                if name is None:
                    raise ValueError(f"not a host name or address: {entry!r}")
                self.names.add(name)

    def allows(self, header: str | None) -> bool:
        name = host_name(header)
        if name is None:
            return False
        if self.any or name in self.names:
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False
        return self.any_ip or (self.any_v4 and address.version == 4)


def _netloc(scheme: str, netloc: str) -> str:
    """``host:port`` without the scheme's default port, lower case."""
    value = netloc.lower()
    default = {"http": ":80", "https": ":443"}.get(scheme)
    return value[: -len(default)] if default and value.endswith(default) else value


def cross_site(method: str, headers: Mapping[str, str], scheme: str) -> str | None:
    """Why a state-changing request is refused as cross-site (None: it is not): a
    ``Sec-Fetch-Site`` other than same-origin/none, or an ``Origin`` whose host and port
    are not this request's ``Host`` (``null`` included). Requests with neither header
    (curl, old browsers) still need the CSRF token."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return None
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"refused a {site} request (Sec-Fetch-Site)"
    origin = headers.get("origin")
    if origin is None:
        return None
    parts = urlsplit(origin)
    host = headers.get("host", "")
    if origin == "null" or not parts.netloc:
        return "refused a request from an opaque origin"
    if _netloc(parts.scheme, parts.netloc) != _netloc(scheme, host):
        return "refused a request from another origin"
    return None


# -- failed logins --------------------------------------------------------------------------


class Throttle:
    """At most ``limit`` failed logins per client in ``window`` seconds; past that, every
    request of that client (right password or not) is refused until the oldest failure
    ages out. Per process and bounded (``max_clients``): it slows guessing to ``limit``
    per window per address, it is not an account lockout."""

    def __init__(
        self,
        limit: int = 10,
        window: float = 60.0,
        *,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.window, self.max_clients, self.clock = limit, window, max_clients, clock
        self._failures: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict()
        )

    def _recent(self, client: str) -> collections.deque[float]:
        found = self._failures.get(client)
        if found is None:
            return collections.deque()
        cutoff = self.clock() - self.window
        while found and found[0] <= cutoff:
            found.popleft()
        return found

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again; None when it may now."""
        recent = self._recent(client)
        if len(recent) < self.limit:
            return None
        return max(recent[0] + self.window - self.clock(), 0.1)

    def failed(self, client: str) -> None:
        recent = self._recent(client)
        recent.append(self.clock())
        while len(recent) > self.limit:
            recent.popleft()
        self._failures[client] = recent
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)


# -- configuration ------------------------------------------------------------------------

_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")


def check_base_path(value: str) -> str:
    """``--base-path`` as links are written with it: empty, or ``/a/b`` (no trailing
    slash). Refuses what a browser would read as another host (``//evil.example``), dot
    segments, and characters that need escaping."""
    if value in ("", "/"):
        return ""
    if not value.startswith("/") or value.startswith("//") or len(value) > 200:
        raise ValueError("--base-path must be a path like /ops/queue")
    segments = value.rstrip("/").split("/")[1:]
    for segment in segments:
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise ValueError(f"--base-path has a bad segment {segment!r} (letters, digits, ._~-)")
    return "/" + "/".join(segments)
