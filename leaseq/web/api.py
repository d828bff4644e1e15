"""The JSON endpoints under ``/api/v1/`` served by ``leaseq web`` beside the dashboard,
behind the same guard (Host allow-list, authentication, security headers) and under the
dashboard's statement timeout. So far: the autoscaling signal (docs/autoscaling.md).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from leaseq.models import QueueScaling
from leaseq.web.context import Web

#: WorkerConfig's default concurrency, which the view assumes for a queue without a setting.
DEFAULT_CONCURRENCY = 10


def api_routes(web: Web) -> list[Route]:
    async def autoscaling(request: Request) -> Response:
        rows = await web.client.web_autoscaling()
        return JSONResponse({"queues": [row.as_dict() for row in rows]})

    async def autoscaling_queue(request: Request) -> Response:
        queue = request.path_params["queue"]
        rows = await web.client.web_autoscaling(queue)
        # A queue with nothing to do and no setting has no row: it needs no worker (an
        # autoscaler reads 0, not an error).
        row = (
            rows[0]
            if rows
            else QueueScaling(queue, 0, 0, 0.0, False, DEFAULT_CONCURRENCY, 0, None, None, 0)
        )
        return JSONResponse(row.as_dict())

    return [
        Route("/api/v1/autoscaling", autoscaling),
        Route("/api/v1/autoscaling/{queue:path}", autoscaling_queue),
    ]
