"""The dashboard's actions (POST): replay, cancel, bulk replay and purge of dead jobs by
filter (with a dry-run count), skip of a blocked key's dead head, pause and resume.

Each checks, in order: the CSRF token, that the user may do it (never in read-only mode),
the form; then calls the same audited client operation as the CLI, with the authenticated
user as the actor, and ends with a 303 redirect to its page (POST-redirect-GET: a reload
repeats nothing). A refusal (not dead, a live duplicate holds the unique key, not paused,
bad input) is a message on the page with a 4xx status, and nothing is changed. A bulk
replay or purge without any filter (every dead job) also needs the confirmation
``all N`` naming how many dead jobs there are, as the CLI needs ``--all``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from leaseq.errors import LeaseqError, ReplayRefused
from leaseq.web import forms
from leaseq.web.context import Web
from leaseq.web.pages import Pages
from leaseq.web.security import CSRF_FIELD

#: How far the "all" confirmation counts (a purge of more is refused: narrow the filter).
ALL_CAP = 10_000_000

Handler = Callable[[Request, FormData], Awaitable[Response]]
#: Renders the page an action belongs to with a refusal: (request, form, error, status).
RefusalPage = Callable[[Request, FormData, str, int], Awaitable[Response]]


class Actions:
    def __init__(self, web: Web, pages: Pages) -> None:
        self.web = web
        self.pages = pages

    def guarded(
        self, action: str, handler: Handler, page: RefusalPage
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind the CSRF check and authorization of ``action``; a refusal is
        ``page`` rendered with the message."""

        async def endpoint(request: Request) -> Response:
            form = await request.form()
            token = form.get(CSRF_FIELD)
            why = self.web.csrf_refusal(request, token if isinstance(token, str) else None)
            if why is not None:
                return await page(request, form, why, 403)
            if not self.web.allowed(request, action):
                why = "the dashboard is read-only" if self.web.read_only else "not allowed"
                return await page(request, form, f"{action}: {why}", 403)
            try:
                return await handler(request, form)
            except forms.BadInput as exc:
                return await page(request, form, str(exc), 400)
            except ReplayRefused as exc:
                return await page(request, form, f"replay refused: {exc}", 409)
            except LeaseqError as exc:
                return await page(request, form, str(exc), 400)

        return endpoint

    # -- one job ------------------------------------------------------------------------

    async def replay(self, request: Request, form: FormData) -> Response:
        job_id = forms.job_id(request.path_params.get("job_id"))
        reason = forms.reason(form, "a replay")
        done = await self.web.client.replay(job_id, reason=reason, actor=self.web.actor(request))
        if not done:
            return await self.pages.job_page(
                request, error=f"job {job_id} is not dead: nothing replayed", status=409
            )
        return self.web.done(request, f"/jobs/{job_id}", f"job {job_id} replayed: pending")

    async def cancel(self, request: Request, form: FormData) -> Response:
        job_id = forms.job_id(request.path_params.get("job_id"))
        reason = forms.text(form, "reason", "reason", forms.MAX_REASON)
        done = await self.web.client.cancel(job_id, reason=reason, actor=self.web.actor(request))
        if not done:
            return await self.pages.job_page(
                request, error=f"job {job_id} is already finished: nothing cancelled", status=409
            )
        message = f"job {job_id}: cancelled (or, if running, asked to stop)"
        return self.web.done(request, f"/jobs/{job_id}", message)

    # -- dead jobs by filter ------------------------------------------------------------

    async def dead_bulk(self, request: Request, form: FormData) -> Response:
        """Replay or purge every dead job the filter matches; ``dry_run`` only counts."""
        verb = "purge" if request.url.path.endswith("/purge") else "replay"
        filters: dict[str, Any] = forms.dead_filters(form)
        if form.get("dry_run"):
            _, count = await self.web.client.web_dead(limit=1, cap=10_000, **filters)
            more = "+" if count >= 10_000 else ""
            return await self.pages.dead_page(
                request, form, message=f"dry run: {verb} would take {count}{more} dead jobs"
            )
        reason = forms.reason(form, f"a {verb}")
        if not any(filters.values()):
            _, count = await self.web.client.web_dead(limit=1, cap=ALL_CAP, **filters)
            wanted = f"all {count}"
            typed = " ".join(str(form.get("confirm_all") or "").split())
            if typed != wanted:
                raise forms.BadInput(
                    f"no filter: this would {verb} every dead job; to do that, type "
                    f"“{wanted}” in the confirmation box (or filter by queue, task or code)"
                )
        actor = self.web.actor(request)
        back = forms.dead_query(filters)
        if verb == "purge":
            purged = await self.web.client.purge_dead(reason=reason, actor=actor, **filters)
            return self.web.done(request, back, f"purged {purged} jobs")
        result = await self.web.client.replay_many(reason=reason, actor=actor, **filters)
        message = f"replayed {int(result)} jobs"
        if result.refused:
            shown = ", ".join(f"{job} (held by {holder})" for job, holder in result.refused[:10])
            message += f"; {len(result.refused)} refused, their unique key is held: {shown}"
        return self.web.done(request, back, message)

    # -- keys and pauses ----------------------------------------------------------------

    async def skip(self, request: Request, form: FormData) -> Response:
        job_id = forms.job_id(request.path_params.get("job_id"))
        reason = forms.reason(form, "a skip")
        done = await self.web.client.skip_dead_head(
            job_id, reason=reason, actor=self.web.actor(request)
        )
        if not done:
            return await self.pages.keys_page(
                request, error=f"job {job_id} is not a blocking dead head", status=409
            )
        return self.web.done(request, "/keys", f"skipped job {job_id}")

    def _scope(self, form: FormData) -> dict[str, str]:
        scope = forms.text(form, "scope", "scope") or ""
        if scope not in ("queue", "task", "ordering_key"):
            raise forms.BadInput("scope must be queue, task or ordering_key")
        value = forms.text(form, "value", scope.replace("_", " "))
        if value is None:
            raise forms.BadInput(f"name the {scope.replace('_', ' ')} to act on")
        return {scope: value}

    async def pause(self, request: Request, form: FormData) -> Response:
        scope = self._scope(form)
        reason = forms.reason(form, "a pause")
        created = await self.web.client.pause(
            scope.get("queue"),
            task=scope.get("task"),
            ordering_key=scope.get("ordering_key"),
            reason=reason,
            actor=self.web.actor(request),
        )
        what = next(iter(scope.values()))
        message = f"paused {what}" if created else f"{what} was already paused (kept as it was)"
        return self.web.done(request, "/pauses", message)

    async def resume(self, request: Request, form: FormData) -> Response:
        scope = self._scope(form)
        reason = forms.text(form, "reason", "reason", forms.MAX_REASON)
        done = await self.web.client.resume(
            scope.get("queue"),
            task=scope.get("task"),
            ordering_key=scope.get("ordering_key"),
            reason=reason,
            actor=self.web.actor(request),
        )
        what = next(iter(scope.values()))
        if not done:
            return await self.pages.pauses_page(request, error=f"{what} was not paused", status=409)
        return self.web.done(request, "/pauses", f"resumed {what}")
