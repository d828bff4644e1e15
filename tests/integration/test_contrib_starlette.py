"""leaseq.contrib.starlette with FastAPI's and Starlette's TestClient on a real PostgreSQL:
the lifespan opens and closes the client, the dependency hands it to endpoints, and the
optional in-process worker runs what they enqueue; a missing schema fails the startup."""

from __future__ import annotations

import time
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import leaseq
from leaseq.contrib.starlette import Leaseq, leaseq_client
from leaseq.errors import SchemaError
from leaseq.testing import Kit
from leaseq.worker import WorkerConfig

JobClient = Annotated[leaseq.AsyncClient, Depends(leaseq_client)]


def make_api(jobs: leaseq.App, integration: Leaseq) -> FastAPI:
    api = FastAPI(lifespan=integration.lifespan)

    @api.post("/signup")
    async def signup(email: str, client: JobClient) -> dict[str, int]:
        return {"job": await client.enqueue("mail.welcome", {"to": email})}

    return api


def wait_for_status(kit: Kit, job_id: int, status: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        job = kit.client.get_job(job_id)
        if job is not None and job.status == status:
            return
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} never reached {status}")


def test_fastapi_endpoint_enqueues_through_the_dependency(
    leaseq_dsn: str, leaseq_testing: Kit
) -> None:
    jobs = leaseq.App(leaseq_dsn)
    integration = Leaseq(jobs)
    with TestClient(make_api(jobs, integration)) as web:
        reply = web.post("/signup", params={"email": "a@example.com"})
        assert reply.status_code == 200
        job = leaseq_testing.assert_enqueued("mail.welcome", payload_subset={"to": "a@example.com"})
        assert reply.json() == {"job": job.job_id}
        assert (
            jobs.async_client.pool_stats()["idle"] + jobs.async_client.pool_stats()["in_use"] >= 1
        )
    # Shutdown closed the pool.
    assert jobs.async_client.pool_stats() == {"in_use": 0, "idle": 0, "waiting": 0}


def test_the_in_process_worker_runs_jobs_and_stops_with_the_app(
    leaseq_dsn: str, leaseq_testing: Kit
) -> None:
    jobs = leaseq.App(leaseq_dsn)
    sent: list[Any] = []

    @jobs.task(name="mail.welcome")
    async def welcome(ctx: Any, payload: Any) -> None:
        sent.append(payload["to"])

    integration = Leaseq(jobs, worker=WorkerConfig(queues=("default",), poll_interval=0.2))
    with TestClient(make_api(jobs, integration)) as web:
        assert integration.worker is not None
        job_id = web.post("/signup", params={"email": "w@example.com"}).json()["job"]
        wait_for_status(leaseq_testing, job_id, "succeeded")
    assert sent == ["w@example.com"]
    assert integration.worker is None  # stopped and awaited at shutdown


def test_plain_starlette_reads_the_client_from_request_state(
    leaseq_dsn: str, leaseq_testing: Kit
) -> None:
    async def enqueue(request: Request) -> JSONResponse:
        client: leaseq.AsyncClient = request.state.leaseq
        return JSONResponse({"job": await client.enqueue("report.build", {"id": 1})})

    integration = Leaseq(leaseq.App(leaseq_dsn))
    web_app = Starlette(
        routes=[Route("/", enqueue, methods=["POST"])], lifespan=integration.lifespan
    )
    with TestClient(web_app) as web:
        job_id = web.post("/").json()["job"]
    assert leaseq_testing.assert_enqueued("report.build").job_id == job_id


def test_startup_fails_when_the_schema_is_missing_unless_asked_to_migrate(
    leaseq_dsn: str,
) -> None:
    missing = leaseq.App(leaseq_dsn, schema="not_migrated")
    with (
        pytest.raises(SchemaError, match="not set up"),
        TestClient(make_api(missing, Leaseq(missing))),
    ):
        pass
    migrating = leaseq.App(leaseq_dsn, schema="migrated_at_startup")
    with TestClient(make_api(migrating, Leaseq(migrating, migrate=True))) as web:
        assert web.post("/signup", params={"email": "m@example.com"}).status_code == 200
