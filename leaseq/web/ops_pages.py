"""The dashboard's operational pages (GET) beyond the job lists: /workers (who holds
leases now, stale leases), /tasks (per task: successes, deaths, run time p50/p95/p99 and
failure rate over a time window, computed in SQL), /dead/groups (dead jobs by error code)
and /find (a job by id). Every read goes through the client's ``web_*`` operations (the
statement timeout, bounded rows, partial indexes or a bounded primary-key range).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from leaseq.web import forms
from leaseq.web.context import Web

#: The windows /tasks offers: label -> seconds.
TASK_WINDOWS = {"15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800}


class OpsPages:
    def __init__(self, web: Web) -> None:
        self.web = web

    async def workers(self, request: Request) -> Response:
        owners = await self.web.client.web_workers()
        context = {
            "owners": owners,
            "running": sum(o.running for o in owners),
            "stale": sum(o.stale for o in owners),
        }
        return self.web.render(request, "workers.html", context)

    async def tasks(self, request: Request) -> Response:
        window = request.query_params.get("window", "1h")
        if window not in TASK_WINDOWS:
            context: dict[str, Any] = {
                "tasks": [],
                "window": "1h",
                "windows": TASK_WINDOWS,
                "error": f"window must be one of {', '.join(TASK_WINDOWS)}",
            }
            return self.web.render(request, "tasks.html", context, 400)
        found = await self.web.client.web_tasks(seconds=TASK_WINDOWS[window])
        context = {"tasks": found, "window": window, "windows": TASK_WINDOWS}
        return self.web.render(request, "tasks.html", context)

    async def dead_groups(self, request: Request) -> Response:
        try:
            queue = forms.text(request.query_params, "queue", "queue")
        except forms.BadInput as exc:
            failed: dict[str, Any] = {"groups": [], "queue": "", "error": str(exc)}
            return self.web.render(request, "dead_groups.html", failed, 400)
        groups = await self.web.client.web_dead_groups(queue=queue)
        context = {"groups": groups, "queue": queue or ""}
        return self.web.render(request, "dead_groups.html", context)

    async def find(self, request: Request) -> Response:
        """``/find?id=N``: straight to the job's page (a 404 there when it does not exist)."""
        try:
            job_id = forms.job_id(request.query_params.get("id"))
        except forms.BadInput as exc:
            context: dict[str, Any] = {
                "jobs": [],
                "filters": {},
                "counts": [],
                "bulk_actions": forms.BULK_ACTIONS,
                "error": str(exc),
            }
            return self.web.render(request, "jobs.html", context, 400)
        return RedirectResponse(f"{self.web.base(request)}/jobs/{job_id}", status_code=303)
