"""Pages for capabilities this client may not have yet (limits; schedules have their own
page in ``schedules.py``). Each page
(its route and its link in the navigation) exists only when the client has the operation,
``client.schedules()`` / ``client.limits()``; its rows are shown field by field, whatever
their type (data classes, mappings, tuples), at most 1000 of them. Their actions (run now,
enable/disable, resize) are wired when those operations are merged.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from leaseq.web.context import Web

#: Client operation -> page title.
EXTRA_PAGES = {"limits": "Limits"}
MAX_ROWS = 1000


def as_fields(item: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if isinstance(item, Mapping):
        return dict(item)
    if isinstance(item, tuple | list):
        return {str(i): value for i, value in enumerate(item)}
    return {"value": item}


def extra_routes(web: Web) -> list[Route]:
    """A route for each extra operation the client has."""
    return [
        Route(f"/{name}", _page(web, name, title))
        for name, title in EXTRA_PAGES.items()
        if callable(getattr(web.client, name, None))
    ]


async def render_extra(
    web: Web,
    request: Request,
    name: str,
    error: str | None = None,
    status: int = 200,
) -> Response:
    """The page of the extra operation ``name`` (with a refusal's message)."""
    # The dashboard's own read when there is one (under its statement timeout).
    found = getattr(web.client, f"web_{name}", getattr(web.client, name))()
    if inspect.isawaitable(found):
        found = await found
    rows = [as_fields(item) for item in list(found)[:MAX_ROWS]]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    context = {"title": EXTRA_PAGES[name], "name": name, "columns": columns, "rows": rows}
    return web.render(request, "extra.html", {**context, "error": error}, status)


def _page(web: Web, name: str, title: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await render_extra(web, request, name)

    return endpoint
