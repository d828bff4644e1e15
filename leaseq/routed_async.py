"""Queues on several databases: one client per database, each call routed by its queue.

``AsyncRoutedClient(QueueMap({"emails": dsn_b}, default=dsn_a))`` holds an
:class:`~leaseq.client_async.AsyncClient` per database of the map (``leaseq.rules.routing``) and
sends enqueue, enqueue_many, flows, batches and the inspection of a queue to the database
of that queue; ``migrate`` and ``check_schema`` run on every database. It is not one of the
client's operation mixins but a client over clients, so it sits beside the client it is
made of (its sync twin, ``leaseq/routed.py``, is generated like the client's).

What cannot span databases is refused in one line before anything is stored: an
``enqueue_many`` or flow whose items are on queues of different databases (one call is one
transaction), a dependency on a job this router enqueued in another database, a batch's job
or callback on a queue of another database than the batch's, and ``connection=`` (the
caller's transaction) on another database than the queue's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, Unpack

from psycopg import AsyncConnection

from leaseq.client_async import AsyncClient
from leaseq.errors import ConfigError
from leaseq.jobspec import DEFAULT_QUEUE, EnqueueOptions, JobSpec, job_fields
from leaseq.models import Job, JobFilter, QueueStats
from leaseq.ops.batches_async import AsyncBatch
from leaseq.rules.routing import QueueMap, RoutedResult, check_dependencies, one_database
from leaseq.rules.unique import EnqueueResult
from leaseq.workflows import Flow, Sig, flow_items


def _queue_of(item: JobSpec | Mapping[str, Any]) -> str:
    return str(job_fields(item).get("queue") or DEFAULT_QUEUE)


class AsyncRoutedBatch:
    """An open batch on the database of the queue it was opened for: its jobs must be on
    queues of that database too."""

    def __init__(self, router: AsyncRoutedClient, batch: AsyncBatch, database: str | None):
        self.router = router
        self.batch = batch
        self.id = batch.id
        self.database = database

    def _check(self, queues: Iterable[str], what: str) -> None:
        home = self.router.queue_map.where(self.database)
        for queue in queues:
            if self.router.queue_map.dsn_for(queue) != self.database:
                raise ConfigError(
                    f"{what}: queue {queue!r} is not on the batch's database ({home}); "
                    "a batch cannot span databases; nothing was stored"
                )

    async def enqueue(
        self, task: str, payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> EnqueueResult:
        queue = str(options.get("queue") or DEFAULT_QUEUE)
        self._check([queue], "batch enqueue")
        check_dependencies(self.router.queue_map, queue, options.get("depends_on"))
        return RoutedResult.of(await self.batch.enqueue(task, payload, **options), self.database)

    async def enqueue_many(
        self, jobs: Iterable[JobSpec | Mapping[str, Any]]
    ) -> list[EnqueueResult]:
        items = list(jobs)
        self._check([_queue_of(j) for j in items], "batch enqueue_many")
        done = await self.batch.enqueue_many(items)
        return [RoutedResult.of(r, self.database) for r in done]

    async def enqueue_flow(self, flow: Flow) -> list[EnqueueResult]:
        return await self.enqueue_many(flow_items(flow))

    async def seal(self) -> bool:
        return await self.batch.seal()


class AsyncRoutedClient:
    """One client per database of ``queues`` (a :class:`~leaseq.rules.routing.QueueMap`, or a
    mapping of queue -> DSN with ``default``); every call goes to its queue's database.
    ``client_options`` (schema, pool_size, retry_policy, ...) apply to every client."""

    def __init__(
        self,
        queues: QueueMap | Mapping[str, str],
        *,
        default: str | None = None,
        **client_options: Any,
    ) -> None:
        if isinstance(queues, QueueMap):
            if default is not None:
                raise ConfigError("give default= to the QueueMap, not beside it")
            self.queue_map = queues
        else:
            self.queue_map = QueueMap(queues, default=default)
        self._clients: dict[str | None, AsyncClient] = {
            dsn: AsyncClient(dsn, **client_options) for dsn in self.queue_map.databases()
        }
        self._identities: dict[str | None, tuple[str, str]] = {}

    # -- the clients ------------------------------------------------------------------

    def client_for(self, queue: str) -> AsyncClient:
        """The client of ``queue``'s database (for anything this router does not route)."""
        return self._clients[self.queue_map.dsn_for(queue)]

    @property
    def clients(self) -> list[AsyncClient]:
        """One client per database, the default's first."""
        return list(self._clients.values())

    async def migrate(self) -> int:
        """Migrate every database of the map; returns the schema version."""
        versions = [await client.migrate() for client in self.clients]
        return versions[0]

    async def check_schema(self) -> int:
        versions = [await client.check_schema() for client in self.clients]
        return versions[0]

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _identity(self, conn: AsyncConnection[Any], queries: Any) -> tuple[str, str]:
        cur = await conn.execute(queries["database_identity"])
        row = await cur.fetchone()
        assert row is not None
        return str(row[0]), str(row[1])

    async def _check_connection(self, conn: AsyncConnection[Any], queue: str) -> None:
        """``connection=`` must be on the database of ``queue`` (same cluster and database)."""
        dsn = self.queue_map.dsn_for(queue)
        client = self._clients[dsn]
        if dsn not in self._identities:
            async with client.connection() as own:
                self._identities[dsn] = await self._identity(own, client.queries)
        if await self._identity(conn, client.queries) != self._identities[dsn]:
            raise ConfigError(
                f"connection= is not on the database of queue {queue!r} "
                f"({self.queue_map.where(dsn)}): a transactional enqueue cannot span "
                "databases; nothing was stored"
            )

    # -- enqueue ----------------------------------------------------------------------

    async def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        connection: AsyncConnection[Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """``AsyncClient.enqueue`` on ``queue``'s database. The result carries that
        database (``RoutedResult.database``). ``depends_on`` and ``batch_id`` name jobs and
        batches of that database; a dependency on a result of another database is refused."""
        queue = str(options.get("queue") or DEFAULT_QUEUE)
        check_dependencies(self.queue_map, queue, options.get("depends_on"))
        if connection is not None:
            await self._check_connection(connection, queue)
        client = self.client_for(queue)
        done = await client.enqueue(task, payload, connection=connection, **options)
        return RoutedResult.of(done, self.queue_map.dsn_for(queue))

    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        connection: AsyncConnection[Any] | None = None,
    ) -> list[EnqueueResult]:
        """``AsyncClient.enqueue_many`` on the one database of all the items' queues; items
        on queues of different databases are refused (one call is one transaction)."""
        items = list(jobs)
        queues = [_queue_of(item) for item in items]
        dsn = one_database(self.queue_map, queues, "enqueue_many")
        for item, queue in zip(items, queues, strict=True):
            check_dependencies(self.queue_map, queue, job_fields(item).get("depends_on"))
        if connection is not None and queues:
            await self._check_connection(connection, queues[0])
        done = await self._clients[dsn].enqueue_many(items, connection=connection)
        return [RoutedResult.of(r, dsn) for r in done]

    async def enqueue_flow(self, flow: Flow) -> list[EnqueueResult]:
        """A chain or group: every step on queues of one database."""
        return await self.enqueue_many(flow_items(flow))

    @contextlib.asynccontextmanager
    async def batch(
        self,
        *,
        queue: str = "default",
        on_success: Sig | None = None,
        on_failure: Sig | None = None,
        on_finish: Sig | None = None,
    ) -> AsyncIterator[AsyncRoutedBatch]:
        """A batch on ``queue``'s database (sealed on exit); its jobs and callbacks must be
        on queues of that database."""
        dsn = self.queue_map.dsn_for(queue)
        callbacks = [s for s in (on_success, on_failure, on_finish) if s is not None]
        queues = [queue, *(str(s.options.get("queue") or DEFAULT_QUEUE) for s in callbacks)]
        one_database(self.queue_map, queues, "a batch and its callbacks")
        client = self._clients[dsn]
        async with client.batch(
            on_success=on_success, on_failure=on_failure, on_finish=on_finish
        ) as opened:
            yield AsyncRoutedBatch(self, opened, dsn)

    # -- inspection -------------------------------------------------------------------

    async def get_job(self, job_id: int, *, queue: str) -> Job | None:
        """A job of ``queue``'s database (ids are per database)."""
        return await self.client_for(queue).get_job(job_id)

    async def list_jobs(
        self, status: str = "dead", *, limit: int = 100, **filters: Unpack[JobFilter]
    ) -> list[Job]:
        """``AsyncClient.list_jobs`` on the database of the ``queue`` filter (required)."""
        queue = filters.get("queue")
        if not queue:
            raise ConfigError("list_jobs on several databases needs queue= (ids are per database)")
        return await self.client_for(queue).list_jobs(status, limit=limit, **filters)

    async def queue_stats(self, *, throughput: bool = False) -> list[QueueStats]:
        """Every database's queue stats, each queue from the database it is routed to."""
        found: list[QueueStats] = []
        for dsn, client in self._clients.items():
            stats = await client.queue_stats(throughput=throughput)
            found += [s for s in stats if self.queue_map.dsn_for(s.queue) == dsn]
        return sorted(found, key=lambda s: s.queue)
