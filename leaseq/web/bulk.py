"""The dashboard's newer actions (POST), behind the same guard as ``actions.py`` (CSRF,
authorization, read-only) and ending the same way (a 303 with a flash): the job list's bulk
selection (cancel, retry = replay a dead job, delete = purge a dead job; at most 100 ids),
running a job scheduled for later now and deleting one dead job from its page, and
setting or removing a limit on /limits. Each calls an audited client operation, one job at
a time, with the dashboard user as the actor.
"""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from leaseq.errors import ReplayRefused
from leaseq.rules.limits import RateLimit
from leaseq.web import forms
from leaseq.web.context import Web


class BulkActions:
    def __init__(self, web: Web) -> None:
        self.web = web

    async def jobs(self, request: Request, form: FormData) -> Response:
        """The selection's action on each selected job; the flash counts what changed."""
        action = str(form.get("action") or "")
        if action not in forms.BULK_ACTIONS:
            raise forms.BadInput(f"unknown bulk action {action!r}")
        needed = {"cancel": "cancel", "replay": "replay", "delete": "purge"}[action]
        if not self.web.allowed(request, needed):
            raise forms.BadInput(f"{needed}: not allowed")
        ids = forms.selected_ids(form)
        reason = forms.reason(form, f"a bulk {action}")
        actor = self.web.actor(request)
        client = self.web.client
        done: list[int] = []
        skipped: list[int] = []
        for job_id in ids:
            if action == "cancel":
                changed = await client.cancel(job_id, reason=reason, actor=actor)
            elif action == "replay":
                try:
                    changed = await client.replay(job_id, reason=reason, actor=actor)
                except ReplayRefused:
                    changed = False
            else:
                changed = bool(await client.purge_dead(reason=reason, actor=actor, job_id=job_id))
            (done if changed else skipped).append(job_id)
        verb = {"cancel": "cancelled", "replay": "replayed", "delete": "deleted"}[action]
        message = f"{verb} {len(done)} of {len(ids)} selected jobs"
        if skipped:
            shown = ", ".join(str(j) for j in skipped[:20])
            message += f"; left as they were (finished, not dead or refused): {shown}"
        return self.web.done(request, "/jobs", message)

    async def run_now(self, request: Request, form: FormData) -> Response:
        """A pending job scheduled for later, available now (audited)."""
        job_id = forms.job_id(request.path_params.get("job_id"))
        reason = forms.reason(form, "running a job now")
        done = await self.web.client.run_now(job_id, reason=reason, actor=self.web.actor(request))
        if not done:
            message = f"job {job_id} is not scheduled for later: nothing changed"
            return self.web.done(request, f"/jobs/{job_id}", message, "error")
        return self.web.done(request, f"/jobs/{job_id}", f"job {job_id} is available now")

    async def delete_one(self, request: Request, form: FormData) -> Response:
        job_id = forms.job_id(request.path_params.get("job_id"))
        reason = forms.reason(form, "a delete")
        purged = await self.web.client.purge_dead(
            reason=reason, actor=self.web.actor(request), job_id=job_id
        )
        if not purged:
            return self.web.done(
                request, f"/jobs/{job_id}", f"job {job_id} is not dead: nothing deleted", "error"
            )
        return self.web.done(request, "/dead", f"job {job_id} deleted")

    async def set_limit(self, request: Request, form: FormData) -> Response:
        """Set (or, with ``remove``, delete) the limit named in the form; audited."""
        name = forms.text(form, "name", "limit name")
        if name is None:
            raise forms.BadInput("name the limit (queue:NAME, task:NAME, key:KEY, key:PREFIX:*)")
        reason = forms.reason(form, "changing a limit")
        actor = self.web.actor(request)
        if form.get("remove"):
            removed = await self.web.client.remove_limit(name, actor=actor, reason=reason)
            message = f"limit {name} removed" if removed else f"no limit named {name}"
            return self.web.done(request, "/limits", message, "ok" if removed else "error")
        concurrency = _whole(form, "concurrency", "concurrency")
        rate = _whole(form, "rate", "rate")
        per = _whole(form, "per", "per seconds") or 1
        if concurrency is None and rate is None:
            raise forms.BadInput("give a concurrency, a rate, or both")
        await self.web.client.set_limit(
            name,
            concurrency=concurrency,
            rate=RateLimit(rate, per) if rate is not None else None,
            actor=actor,
            reason=reason,
        )
        return self.web.done(request, "/limits", f"limit {name} set")


def _whole(form: FormData, name: str, label: str) -> int | None:
    value = forms.text(form, name, label, 12)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= 1_000_000:
        raise forms.BadInput(f"{label} must be a whole number from 1 to 1000000")
    return int(value)
