"""Starlette and FastAPI (extra ``leaseq[starlette]``): a lifespan that opens the client's
pool at startup (checking the schema, or migrating it) and closes it at shutdown,
optionally running an in-process worker meanwhile; and a dependency yielding the client.

    jobs = leaseq.App(DSN)
    integration = Leaseq(jobs, worker=WorkerConfig(queues=("default",)))
    api = FastAPI(lifespan=integration.lifespan)

    JobClient = Annotated[AsyncClient, Depends(leaseq_client)]

    @api.post("/signup")
    async def signup(client: JobClient) -> dict[str, int]:
        return {"job": await client.enqueue("mail.welcome", {"to": "a@example.com"})}

The client is also in ``request.state.leaseq`` (the lifespan's state).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from leaseq.app import App
from leaseq.client_async import AsyncClient
from leaseq.errors import ConfigError
from leaseq.worker import WorkerConfig
from leaseq.worker.runner import Worker

STATE_KEY = "leaseq"


class Leaseq:
    """Ties an App's async client (and optionally a worker) to a web app's lifespan."""

    def __init__(
        self, app: App, *, worker: WorkerConfig | None = None, migrate: bool = False
    ) -> None:
        self.app = app
        self.worker_config = worker
        self.migrate = migrate
        #: The running in-process worker, between startup and shutdown.
        self.worker: Worker | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, web_app: Any) -> AsyncIterator[dict[str, Any]]:
        client = self.app.async_client
        if self.migrate:
            await client.migrate()
        else:
            await client.check_schema()  # a missing schema fails the startup, not a request
        runner: asyncio.Task[Any] | None = None
        if self.worker_config is not None:
            self.worker = Worker(self.app, self.worker_config)
            runner = asyncio.create_task(self.worker.run(install_signal_handlers=False))
        try:
            yield {STATE_KEY: client}
        finally:
            if runner is not None and self.worker is not None:
                self.worker.stop()
                await runner
                self.worker = None
            await client.close()


async def leaseq_client(request: Request) -> AsyncIterator[AsyncClient]:
    """A dependency (FastAPI ``Depends(leaseq_client)``) yielding the lifespan's client."""
    client = getattr(request.state, STATE_KEY, None)
    if not isinstance(client, AsyncClient):
        raise ConfigError("no leaseq client: use Leaseq(...).lifespan as the app's lifespan")
    yield client
