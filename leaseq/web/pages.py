"""The dashboard's pages (GET): overview (and its live-refresh fragment), queue detail, the
job list, job detail, dead jobs, blocked ordering keys and pauses. Each reads through the
client's ``web_*`` operations (statement timeout, bounded rows); bad filter input is a
message on the page, never a query.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
from starlette.requests import Request
from starlette.responses import Response

from leaseq.codec import shown as at_rest
from leaseq.errors import ConfigError, LeaseqError
from leaseq.models import Job, QueueStats
from leaseq.rules.replicas import unknown_lag_line
from leaseq.web import forms
from leaseq.web.context import Web
from leaseq.web.fair_pages import TOP_KEYS_ON_QUEUE, key_rows

PAGE_SIZE = 50


def payload_text(web: Web, job: Job) -> str:
    """The payload as readable JSON, passed through the client's redaction hook."""
    if job.unreadable is not None and isinstance(job.payload, str):
        shown = job.payload
    else:
        shown = json.dumps(at_rest(job.payload), indent=2, ensure_ascii=False, default=str)
    return web.client.redact(shown) if web.client.redact is not None else shown


def value_text(web: Web, value: Any) -> str:
    """A stored result as readable JSON (a sealed one as such), through the redaction hook."""
    shown = json.dumps(at_rest(value), indent=2, ensure_ascii=False, default=str)
    return web.client.redact(shown) if web.client.redact is not None else shown


class Pages:
    def __init__(self, web: Web) -> None:
        self.web = web

    async def _overview_context(self) -> dict[str, Any]:
        stats, pauses = await self.web.client.web_overview()
        series = await self.web.client.web_throughput()
        waiting = await self.web.client.web_waiting()
        suspended = await self.web.client.web_suspended()
        known = {s.queue for s in stats}
        extra = dict.fromkeys([*series, *waiting, *suspended])
        stats += [QueueStats(q, 0, 0, 0, 0, 0.0, 0.0, 0) for q in extra if q not in known]
        stats.sort(key=lambda s: s.queue)
        paused = {p.value for p in pauses if p.scope == "queue"}
        rows = [
            {
                "stats": s,
                "paused": s.queue in paused,
                "waiting": waiting.get(s.queue, 0),
                "suspended": suspended.get(s.queue, 0),
                "series": series.get(s.queue, [0] * 60),
                "last_hour": sum(series.get(s.queue, [])),
                "last_minute": (series.get(s.queue) or [0])[-1],
            }
            for s in stats
        ]
        return {"rows": rows, "pauses": pauses, "replica_lag": await self._replica_line()}

    async def _replica_line(self) -> str | None:
        """With a read replica (read_dsn): how stale these counts may be. The pages read on
        the replica keep working while the primary is down; the lag is then unknown."""
        try:
            lag = await self.web.client.read_replica_lag()
        except (psycopg.Error, LeaseqError) as exc:
            return unknown_lag_line(exc)
        return lag.describe() if lag is not None else None

    async def overview(self, request: Request) -> Response:
        return self.web.render(request, "overview.html", await self._overview_context())

    async def overview_fragment(self, request: Request) -> Response:
        return self.web.render(request, "_overview.html", await self._overview_context())

    async def queue(self, request: Request) -> Response:
        try:
            name = forms.text(request.path_params, "name", "queue") or ""
        except forms.BadInput as exc:
            failed: dict[str, Any] = {
                "name": "",
                "row": None,
                "jobs": [],
                "pauses": [],
                "error": str(exc),
            }
            return self.web.render(request, "queue.html", failed, 400)
        context = await self._overview_context()
        row = next((r for r in context["rows"] if r["stats"].queue == name), None)
        jobs = await self.web.client.web_jobs(queue=name, limit=20)
        pauses = [p for p in context["pauses"] if p.scope == "queue" and p.value == name]
        try:
            keys = key_rows(await self.web.client.web_fair_keys(name, limit=TOP_KEYS_ON_QUEUE))
        except ConfigError:  # not a queue name leaseq accepts: no keys to show
            keys = []
        return self.web.render(
            request,
            "queue.html",
            {"name": name, "row": row, "jobs": jobs, "pauses": pauses, "keys": keys},
        )

    async def jobs(self, request: Request) -> Response:
        return await self.jobs_page(request)

    async def jobs_page(
        self, request: Request, error: str | None = None, status: int = 200
    ) -> Response:
        query = request.query_params
        shown = {
            k: query.get(k, "")
            for k in ("state", *forms.TEXT_FILTERS, "payload", "created_after", "created_before")
        }
        try:
            found = forms.job_filters(query, self.web.client.redact)
        except forms.BadInput as exc:
            context: dict[str, Any] = {
                "jobs": [],
                "filters": shown,
                "next_before": None,
                "counts": [],
                "bulk_actions": forms.BULK_ACTIONS,
                "error": str(exc),
            }
            return self.web.render(request, "jobs.html", context, status=400)
        state = found.pop("state")
        jobs = await self.web.client.web_jobs(
            statuses=[state] if state else None, limit=PAGE_SIZE, **found
        )
        next_before = jobs[-1].job_id if len(jobs) == PAGE_SIZE else None
        counts, queues = await self._state_counts()
        tasks, codes = await self._suggestions(request)
        context = {
            "jobs": jobs,
            "filters": shown,
            "next_before": next_before,
            "counts": counts,
            "queues": queues,
            "tasks": tasks,
            "error_codes": codes,
            "bulk_actions": forms.BULK_ACTIONS,
            "error": error,
        }
        return self.web.render(request, "jobs.html", context, status)

    async def _suggestions(self, request: Request) -> tuple[list[str], list[str]]:
        """The task and error code filters' suggestions (the newest jobs' values); none
        for a live refresh (live.js), which replaces only the counts and the table."""
        if request.headers.get("x-leaseq-live") == "1":
            return [], []
        return await self.web.client.web_suggestions()

    async def _state_counts(self) -> tuple[list[tuple[str, int, bool]], list[str]]:
        """(state, jobs, exact) for the job list's tabs: the live states counted from the
        partial indexes, history (succeeded, cancelled) the planner's estimate; and the
        queue names (the queue filter's suggestions)."""
        stats, _ = await self.web.client.web_overview()
        waiting = await self.web.client.web_waiting()
        estimates = await self.web.client.web_state_estimates()
        exact = {
            "pending": sum(s.ready + s.scheduled for s in stats) + sum(waiting.values()),
            "running": sum(s.running for s in stats),
            "dead": sum(s.dead for s in stats),
        }
        counts = [
            (state, exact[state], True)
            if state in exact
            else (state, estimates.get(state, 0), False)
            for state in forms.STATES
        ]
        return counts, [s.queue for s in stats]

    async def job(self, request: Request) -> Response:
        return await self.job_page(request)

    async def job_page(
        self,
        request: Request,
        message: str | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        try:
            job_id = forms.job_id(request.path_params.get("job_id"))
        except forms.BadInput as exc:
            return self.web.render(request, "job.html", {"job": None, "error": str(exc)}, 400)
        found = await self.web.client.web_job(job_id)
        if found is None:
            context: dict[str, Any] = {
                "job": None,
                "job_id": job_id,
                "error": f"job {job_id} does not exist",
            }
            return self.web.render(request, "job.html", context, 404)
        job, events, effects, holder, flags = found
        links = await self.web.client.web_job_links(job_id)
        steps, signals = await self.web.client.web_job_durable(job_id)
        result = links.result if links.result is not None and links.result.stored else None
        context = {
            "job": job,
            "flags": flags,
            "links": links,
            "later": job.status == "pending" and job.available_at > dt.datetime.now(dt.UTC),
            "result_text": value_text(self.web, result.value) if result is not None else None,
            "payload": payload_text(self.web, job),
            "events": events,
            "effects": effects,
            # The durable timeline (docs/durable.md): steps in their order, signals sent.
            "steps": [(r, value_text(self.web, r.result)) for r in steps],
            "signals": [(n, value_text(self.web, v), at, who) for n, v, at, who in signals],
            "holder": holder,
            "ordering_key": flags.ordering_key,
            "message": message,
            "error": error,
        }
        return self.web.render(request, "job.html", context, status)

    async def dead(self, request: Request) -> Response:
        return await self.dead_page(request, request.query_params)

    async def dead_page(
        self,
        request: Request,
        form: Any,
        message: str | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        shown = {k: form.get(k, "") for k in ("queue", "task", "error_code")}
        try:
            filters = forms.dead_filters(form)
            raw_before = form.get("before")
            before = forms.job_id(raw_before, "before") if raw_before else None
        except forms.BadInput as exc:
            context: dict[str, Any] = {"jobs": [], "count": 0, "filters": shown, "error": str(exc)}
            return self.web.render(request, "dead.html", context, 400)
        jobs, count = await self.web.client.web_dead(
            limit=PAGE_SIZE, cap=10_000, before=before, **filters
        )
        tasks, codes = await self._suggestions(request)
        context = {
            "jobs": jobs,
            "tasks": tasks,
            "error_codes": codes,
            "next_before": jobs[-1].job_id if len(jobs) == PAGE_SIZE else None,
            "paged": before is not None,
            "count": count,
            "capped": count >= 10_000,
            "filters": shown,
            "message": message,
            "error": error,
        }
        return self.web.render(request, "dead.html", context, status)

    async def keys(self, request: Request) -> Response:
        return await self.keys_page(request)

    async def keys_page(
        self,
        request: Request,
        message: str | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        keys = await self.web.client.web_blocked_keys(limit=100)
        context: dict[str, Any] = {"keys": keys, "message": message, "error": error}
        return self.web.render(request, "keys.html", context, status)

    async def pauses(self, request: Request) -> Response:
        return await self.pauses_page(request)

    async def pauses_page(
        self,
        request: Request,
        message: str | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        pauses = await self.web.client.web_pauses()
        context: dict[str, Any] = {"pauses": pauses, "message": message, "error": error}
        return self.web.render(request, "pauses.html", context, status)
