"""The dashboard's per-key view of a fair queue (docs/fairness.md, docs/dashboard.md):
``GET /queues/{name}/keys`` lists the keys with the largest backlogs (at most
``TOP_KEYS_SHOWN``: a bounded read whatever the number of keys) with each one's weight,
backlog, running jobs, expected share and whether it is parked; ``POST
/queues/{name}/keys/weight`` sets a key's weight through the audited client operation
(``set_fair_weight``, the user as the actor), behind the CSRF check and the authorization of
the action ``weight`` like every other action (leaseq.web.actions.Actions.guarded).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from leaseq.rules.fairness import FairKey
from leaseq.web import forms
from leaseq.web.context import Web

#: Keys a fair queue's page lists (its largest backlogs first).
TOP_KEYS_SHOWN = 50
#: Keys the queue page shows before its link to the full list.
TOP_KEYS_ON_QUEUE = 5


def key_rows(keys: list[FairKey]) -> list[dict[str, Any]]:
    """Each key with its share (its weight over the weights of the listed keys with a
    backlog) for the template."""
    return [{"key": k, "share": k.share(keys)} for k in keys]


def key_path(queue: str) -> str:
    return f"/queues/{quote(queue, safe='')}/keys"


def weight(form: FormData) -> float:
    raw = forms.text(form, "weight", "weight", 40)
    if raw is None:
        raise forms.BadInput("give a weight (a number more than 0)")
    try:
        value = float(raw)
    except ValueError:
        raise forms.BadInput(f"a weight is a number, got {raw[:40]!r}") from None
    if not math.isfinite(value):
        raise forms.BadInput("a weight is a finite number")
    return value


class FairPages:
    def __init__(self, web: Web) -> None:
        self.web = web

    async def page(self, request: Request) -> Response:
        return await self.keys_page(request)

    async def keys_page(
        self, request: Request, error: str | None = None, status: int = 200
    ) -> Response:
        try:
            name = forms.text(request.path_params, "name", "queue") or ""
            keys = await self.web.client.web_fair_keys(name, limit=TOP_KEYS_SHOWN)
        except forms.BadInput as exc:
            context: dict[str, Any] = {"name": "", "keys": [], "error": str(exc)}
            return self.web.render(request, "fair_keys.html", context, 400)
        context = {"name": name, "keys": key_rows(keys), "top": TOP_KEYS_SHOWN, "error": error}
        return self.web.render(request, "fair_keys.html", context, status)

    async def refusal(self, request: Request, form: FormData, error: str, status: int) -> Response:
        return await self.keys_page(request, error=error, status=status)

    async def set_weight(self, request: Request, form: FormData) -> Response:
        name = forms.text(request.path_params, "name", "queue") or ""
        raw_key = form.get("key")
        key = str(raw_key) if isinstance(raw_key, str) else ""
        if len(key) > forms.MAX_TEXT:
            raise forms.BadInput(f"key is too long ({len(key)} characters)")
        value = weight(form)
        reason = forms.text(form, "reason", "reason", forms.MAX_REASON)
        await self.web.client.set_fair_weight(
            name, key, value, actor=self.web.actor(request), reason=reason
        )
        shown = repr(key) if key else "'' (jobs without a key)"
        return self.web.done(request, key_path(name), f"key {shown}: weight {value:g}")
