"""The dashboard's schedules page: every stored schedule with its timing, policies, last and
next tick, and its last job's state; and its actions — run now, enable, disable — each a POST
behind the same CSRF and authorization guard as the other actions, calling the audited client
operations with the dashboard user as the actor. A refusal (unknown schedule, nothing to
change) is a message on the page, never a 500.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from leaseq.errors import LeaseqError
from leaseq.web import forms
from leaseq.web.context import Web

#: Schedules shown at most (a schedules table is small; this bounds the page all the same).
MAX_SCHEDULES = 1000


class SchedulePages:
    def __init__(self, web: Web) -> None:
        self.web = web

    async def page(self, request: Request) -> Response:
        return await self.render(request)

    async def render(
        self,
        request: Request,
        message: str | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        found = (await self.web.client.schedules())[:MAX_SCHEDULES]
        context: dict[str, Any] = {"schedules": found, "message": message, "error": error}
        return self.web.render(request, "schedules.html", context, status)

    async def refusal(self, request: Request, form: FormData, error: str, status: int) -> Response:
        return await self.render(request, error=error, status=status)

    def _name(self, request: Request) -> str:
        name = str(request.path_params.get("name", ""))
        if not name or len(name) > 200:
            raise forms.BadInput("name a schedule (at most 200 characters)")
        return name

    async def run_now(self, request: Request, form: FormData) -> Response:
        name = self._name(request)
        reason = forms.reason(form, "running a schedule now")
        try:
            job_id = await self.web.client.schedule_run_now(
                name, reason=reason, actor=self.web.actor(request)
            )
        except LeaseqError as exc:
            return await self.render(request, error=str(exc), status=409)
        return self.web.done(request, "/schedules", f"schedule {name}: job {job_id} enqueued")

    async def enable(self, request: Request, form: FormData) -> Response:
        return await self._set(request, form, enable=True)

    async def disable(self, request: Request, form: FormData) -> Response:
        return await self._set(request, form, enable=False)

    async def _set(self, request: Request, form: FormData, *, enable: bool) -> Response:
        name = self._name(request)
        verb = "enable" if enable else "disable"
        reason = forms.reason(form, f"to {verb} a schedule")
        change = self.web.client.schedule_enable if enable else self.web.client.schedule_disable
        try:
            changed = await change(name, reason=reason, actor=self.web.actor(request))
        except LeaseqError as exc:
            return await self.render(request, error=str(exc), status=409)
        if not changed:
            return await self.render(
                request, error=f"schedule {name} was already {verb}d: nothing changed", status=409
            )
        return self.web.done(request, "/schedules", f"schedule {name} {verb}d")
