"""What every dashboard handler shares: the client, the templates, the CSRF signer, the auth
hooks and the mode (read-only, base path), and the one way a page is rendered (with the
CSRF token, the user and the links' prefix) or a refusal is shown.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from leaseq.client_async import AsyncClient
from leaseq.web import forms
from leaseq.web.security import CSRF_COOKIE, CSRF_FIELD, AuthHook, AuthorizeHook, Csrf

HERE = pathlib.Path(__file__).resolve().parent

#: Every action the dashboard offers (the names ``authorize`` is asked about).
ACTIONS = ("replay", "purge", "cancel", "skip", "pause", "resume", "schedule")


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.autoescape = True
    env.filters["age"] = forms.age
    env.filters["when"] = forms.when
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

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        token, fresh = self.csrf.token_for(request)
        base = self.base(request)
        full = {
            "base": base,
            "csrf_field": CSRF_FIELD,
            "csrf_token": token,
            "user": self.user(request),
            "read_only": self.read_only,
            "can": {action: self.allowed(request, action) for action in ACTIONS},
            "message": None,
            "error": None,
            "has_schedules": callable(getattr(self.client, "schedules", None)),
            "has_limits": callable(getattr(self.client, "limits", None)),
            **context,
        }
        response = self.templates.TemplateResponse(request, name, full, status_code=status)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path=base or "/",
            )
        return response
