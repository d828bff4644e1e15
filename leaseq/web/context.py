"""What every dashboard handler shares: the client, the templates, the CSRF signer, the auth
hooks and the mode (read-only, base path), the one way a page is rendered (with the session's
CSRF token, the user, the links' prefix and the flash message of the last action) and the one
way an action ends (a 303 redirect to its page: POST-redirect-GET, so a reload repeats
nothing).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from leaseq.client_async import AsyncClient
from leaseq.web import forms
from leaseq.web.security import (
    CSRF_FIELD,
    FLASH_COOKIE,
    SESSION_COOKIE,
    AuthHook,
    AuthorizeHook,
    Csrf,
)

HERE = pathlib.Path(__file__).resolve().parent

#: Every action the dashboard offers (the names ``authorize`` is asked about).
ACTIONS = (
    "replay",
    "purge",
    "cancel",
    "skip",
    "pause",
    "resume",
    "schedule",
    "limit",
    "run",
    "weight",
)


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.autoescape = True
    env.filters["age"] = forms.age
    env.filters["when"] = forms.when
    env.filters["when_in"] = forms.when_in
    env.filters["duration"] = forms.duration
    env.globals["sparkline"] = forms.sparkline
    env.globals["STATES"] = forms.STATES
    return templates


@dataclass
class Web:
    client: AsyncClient
    templates: Jinja2Templates
    csrf: Csrf
    auth: AuthHook | None
    authorize: AuthorizeHook | None
    read_only: bool
    base_path: str
    trust_forwarded: bool = False

    def base(self, request: Request) -> str:
        """The prefix of every link: the configured base path (a reverse proxy's prefix)
        plus where the app is mounted in a larger ASGI app."""
        return self.base_path + str(request.scope.get("root_path", ""))

    def user(self, request: Request) -> Any:
        return request.scope.get("leaseq_user")

    def allowed(self, request: Request, action: str) -> bool:
        """May this request's user do ``action``? Never in read-only mode."""
        if self.read_only:
            return False
        if self.authorize is None:
            return True
        return bool(self.authorize(self.user(request), action))

    def actor(self, request: Request) -> str:
        """The audit trail's actor: the authenticated user, as text."""
        return f"web:{self.user(request)}"[:200]

    def _cookie(self, request: Request, response: Response, name: str, value: str) -> None:
        response.set_cookie(
            name,
            value,
            max_age=None if name == SESSION_COOKIE else 120,
            httponly=True,
            samesite="strict",
            secure=bool(request.scope.get("leaseq_tls")),
            path=self.base(request) or "/",
        )

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        session = self.csrf.session_of(request)
        fresh = session is None
        if session is None:
            session = self.csrf.new_session()
        flash = self.csrf.read_flash(request.cookies.get(FLASH_COOKIE))
        full = {
            "base": self.base(request),
            "csrf_field": CSRF_FIELD,
            "csrf_token": self.csrf.issue(session, self.user(request)),
            "user": self.user(request),
            "read_only": self.read_only,
            "can": {action: self.allowed(request, action) for action in ACTIONS},
            "message": flash[1] if flash and flash[0] == "ok" else None,
            "error": flash[1] if flash and flash[0] == "error" else None,
            "has_schedules": callable(getattr(self.client, "schedules", None)),
            "has_limits": callable(getattr(self.client, "limits", None)),
        }
        for key, value in context.items():
            if key not in ("message", "error") or value is not None:
                full[key] = value
        response = self.templates.TemplateResponse(request, name, full, status_code=status)
        if fresh:
            self._cookie(request, response, SESSION_COOKIE, session)
        if FLASH_COOKIE in request.cookies:
            response.delete_cookie(FLASH_COOKIE, path=self.base(request) or "/")
        return response

    def done(self, request: Request, path: str, message: str, kind: str = "ok") -> Response:
        """An action's end: 303 to ``path`` (under the base), the message in a signed
        cookie the next page shows once."""
        response = RedirectResponse(self.base(request) + path, status_code=303)
        self._cookie(request, response, FLASH_COOKIE, self.csrf.sign_flash(kind, message))
        return response

    def csrf_refusal(self, request: Request, token: str | None) -> str | None:
        """Why this POST's token is refused (None: it is accepted)."""
        return self.csrf.verdict(self.csrf.session_of(request), self.user(request), token)
