"""The HTTP API (docs/http-api.md) on a real PostgreSQL through the real Starlette app and
its guard: bearer tokens (made by `leaseq tokens create`, stored hashed, scoped to actions
and queues, revoked), enqueue one and many, the client's refusals as JSON with the SQL
API's codes, a job read with a wait while a real worker runs it, cancel, replay and signal
audited with the token's name, the queue list, the request log, body limits, the
Host and Origin rules, the API beside the dashboard, and the OpenAPI document against the
routes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

import leaseq
from leaseq.cli import cli

pytest.importorskip("starlette")
pytest.importorskip("httpx")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from leaseq.web import BasicAuth, create_app
from leaseq.web.api import MAX_BODY, OPENAPI, ROUTES, create_api, with_api


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture()
def api(dsn: str, schema: str, client: leaseq.Client) -> Iterator[TestClient]:
    app = with_api(None, create_api(leaseq.AsyncClient(dsn, schema=schema), close_client=True))
    with TestClient(app) as tc:
        yield tc


def _rows(dsn: str, schema: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params).fetchall()


def test_tokens_cli_prints_the_token_once_and_stores_its_hash(
    client: leaseq.Client, dsn: str, schema: str, api: TestClient
) -> None:
    base = ["--dsn", dsn, "--schema", schema]
    runner = CliRunner()
    made = runner.invoke(
        cli, [*base, "tokens", "create", "mailer", "--scope", "enqueue", "--queue", "emails"]
    )
    assert made.exit_code == 0, made.output
    token = made.output.strip().splitlines()[-1]
    assert token.startswith("lq_") and len(token) > 40
    ((stored,),) = _rows(dsn, schema, "SELECT token_hash FROM {s}.api_tokens WHERE name = 'mailer'")
    assert stored == hashlib.sha256(token.encode()).hexdigest() and token not in stored
    listed = runner.invoke(cli, [*base, "tokens", "list"])
    assert "mailer" in listed.output and token not in listed.output
    ok = api.post(
        "/api/v1/jobs", json={"task": "emails.send", "queue": "emails"}, headers=_bearer(token)
    )
    assert ok.status_code == 201, ok.text
    again = runner.invoke(cli, [*base, "tokens", "create", "mailer", "--scope", "read"])
    assert again.exit_code != 0
    revoked = runner.invoke(cli, [*base, "tokens", "revoke", "mailer"])
    assert revoked.exit_code == 0 and "revoked" in revoked.output
    gone = api.post(
        "/api/v1/jobs", json={"task": "emails.send", "queue": "emails"}, headers=_bearer(token)
    )
    assert gone.status_code == 401


def test_scopes_and_queues_bound_what_a_token_does(client: leaseq.Client, api: TestClient) -> None:
    token = client.create_token("t1", scopes=["enqueue"], queues=["emails"])
    auth = _bearer(token)
    assert api.post("/api/v1/jobs", json={"task": "x"}).status_code == 401
    assert (
        api.post("/api/v1/jobs", json={"task": "x"}, headers=_bearer("lq_nope")).status_code == 401
    )
    other = api.post("/api/v1/jobs", json={"task": "x", "queue": "billing"}, headers=auth)
    assert (
        other.status_code == 403 and "may not enqueue on queue 'billing'" in other.json()["error"]
    )
    # The default queue is a queue too.
    assert api.post("/api/v1/jobs", json={"task": "x"}, headers=auth).status_code == 403
    made = api.post("/api/v1/jobs", json={"task": "x", "queue": "emails"}, headers=auth)
    job_id = made.json()["id"]
    assert api.get(f"/api/v1/jobs/{job_id}", headers=auth).status_code == 403
    reader = _bearer(client.create_token("t2", scopes=["read"], queues=["billing"]))
    # A job on a queue the token may not read does not exist for it.
    assert api.get(f"/api/v1/jobs/{job_id}", headers=reader).status_code == 404


def test_enqueue_one_and_many_with_the_clients_checks(
    client: leaseq.Client, dsn: str, schema: str, api: TestClient
) -> None:
    auth = _bearer(client.create_token("w", scopes=["enqueue", "read"]))
    one = api.post(
        "/api/v1/jobs",
        json={
            "task": "emails.send",
            "payload": {"to": "a@example.com"},
            "queue": "emails",
            "priority": 5,
            "run_at": "2030-01-01T00:00:00+00:00",
            "unique_key": "u",
        },
        headers=auth,
    )
    assert one.status_code == 201 and one.json()["inserted"] is True
    job = client.get_job(one.json()["id"])
    assert job is not None and (job.queue, job.priority, job.payload) == (
        "emails",
        5,
        {"to": "a@example.com"},
    )
    dup = api.post("/api/v1/jobs", json={"task": "emails.send", "unique_key": "u"}, headers=auth)
    assert dup.json() == {"id": one.json()["id"], "inserted": False}
    held = api.post(
        "/api/v1/jobs", json={"task": "t", "unique_key": "u", "on_conflict": "raise"}, headers=auth
    )
    assert held.status_code == 409 and held.json()["code"] == "LQ003"
    many = api.post(
        "/api/v1/jobs", json={"jobs": [{"task": "a"}, {"task": "b", "delay": 5}]}, headers=auth
    )
    assert many.status_code == 201 and len(many.json()["jobs"]) == 2
    bad = api.post(
        "/api/v1/jobs", json={"jobs": [{"task": "a"}, {"task": "b", "priority": "x"}]}, headers=auth
    )
    assert bad.status_code == 400 and bad.json()["code"] == "LQ001"
    assert bad.json()["error"] == "priority must be an integer, got 'x'"
    naive = api.post(
        "/api/v1/jobs", json={"task": "a", "run_at": "2030-01-01T00:00:00"}, headers=auth
    )
    assert naive.status_code == 400 and "timezone-aware" in naive.json()["error"]
    big = api.post("/api/v1/jobs", json={"task": "a", "payload": "x" * (1024 * 1024)}, headers=auth)
    assert big.status_code == 400 and big.json()["code"] == "LQ002"
    assert api.post("/api/v1/jobs", content=b"{not json", headers=auth).status_code == 400
    huge = api.post("/api/v1/jobs", content=b"[" + b"1," * MAX_BODY + b"1]", headers=auth)
    assert huge.status_code == 413
    ((stored,),) = _rows(dsn, schema, "SELECT count(*) FROM {s}.jobs")
    assert stored == 3


def test_read_with_wait_while_a_worker_runs_it(
    dsn: str, schema: str, client: leaseq.Client, api: TestClient
) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="add", store_result=True)
    def add(ctx: leaseq.JobContext, payload: dict[str, int]) -> int:
        return payload["a"] + payload["b"]

    auth = _bearer(client.create_token("r", scopes=["enqueue", "read"]))
    job_id = api.post(
        "/api/v1/jobs", json={"task": "add", "payload": {"a": 2, "b": 3}}, headers=auth
    ).json()["id"]
    assert api.get(f"/api/v1/jobs/{job_id}", headers=auth).json()["job"]["status"] == "pending"
    config = leaseq.WorkerConfig(poll_interval=0.05, drain=True)
    worker = threading.Thread(target=lambda: asyncio.run(leaseq.Worker(app, config).run()))
    worker.start()
    try:
        seen = api.get(f"/api/v1/jobs/{job_id}?wait=20", headers=auth).json()
    finally:
        worker.join(timeout=60)
        app.client.close()
    assert seen["job"]["status"] == "succeeded"
    assert seen["result"] == {"stored": True, "value": 5}
    assert api.get(f"/api/v1/jobs/{job_id}?wait=31", headers=auth).status_code == 400
    assert api.get("/api/v1/jobs/999999999", headers=auth).status_code == 404


def test_cancel_and_replay_are_audited_with_the_tokens_name(
    client: leaseq.Client, dsn: str, schema: str, api: TestClient
) -> None:
    auth = _bearer(client.create_token("ops-bot", scopes=["cancel", "replay", "read", "signal"]))
    job_id = int(client.enqueue("t"))
    done = api.post(f"/api/v1/jobs/{job_id}/cancel", json={"reason": "not needed"}, headers=auth)
    assert done.json() == {"id": job_id, "changed": True}
    again = api.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)
    assert again.json() == {"id": job_id, "changed": False}
    dead = int(client.enqueue("t"))
    (lease,) = client.claim("default", worker="w")
    assert lease.job_id == dead and client.fail(lease, "BOOM", retryable=False)
    assert api.post(f"/api/v1/jobs/{dead}/replay", json={}, headers=auth).status_code == 400
    replayed = api.post(f"/api/v1/jobs/{dead}/replay", json={"reason": "fixed"}, headers=auth)
    assert replayed.json() == {"id": dead, "changed": True}
    assert client.get_job(dead).status.value == "pending"  # type: ignore[union-attr]
    events = "SELECT event, actor FROM {s}.job_events WHERE job_id = ANY(%s) ORDER BY id"
    actors = _rows(dsn, schema, events, ([job_id, dead],))
    assert ("cancelled", "ops-bot") in actors
    assert ("replayed", "ops-bot") in actors, actors
    # A finished job takes no signal; a live one stores each send as one delivery.
    signal = api.post(f"/api/v1/jobs/{job_id}/signal", json={"signal": "go"}, headers=auth)
    assert signal.status_code == 200 and signal.json() == {"id": job_id, "stored": False}
    live = int(client.enqueue("t"))
    sent = api.post(
        f"/api/v1/jobs/{live}/signal", json={"signal": "go", "payload": 1}, headers=auth
    )
    assert sent.json() == {"id": live, "stored": True}
    twice = api.post(f"/api/v1/jobs/{live}/signal", json={"signal": "go"}, headers=auth)
    assert twice.json() == {"id": live, "stored": True}, "the name's second delivery"
    assert api.post(f"/api/v1/jobs/{live}/signal", json={}, headers=auth).status_code == 400
    trail = client.api_requests(actor="ops-bot")
    assert ("POST", f"/api/v1/jobs/{live}/signal", 400) == (
        trail[0]["method"],
        trail[0]["path"],
        trail[0]["status"],
    )
    assert {r["path"] for r in trail} >= {
        f"/api/v1/jobs/{job_id}/cancel",
        f"/api/v1/jobs/{job_id}/signal",
        f"/api/v1/jobs/{dead}/replay",
    }
    assert all(r["actor"] == "ops-bot" for r in trail)


def test_queues_lists_what_the_token_may_read(client: leaseq.Client, api: TestClient) -> None:
    client.enqueue("t", queue="emails")
    client.enqueue("t", queue="billing")
    auth = _bearer(client.create_token("q", scopes=["read"], queues=["emails"]))
    found = api.get("/api/v1/queues", headers=auth).json()["queues"]
    assert [q["queue"] for q in found] == ["emails"] and found[0]["ready"] == 1


def test_host_and_origin_rules_apply(dsn: str, schema: str, client: leaseq.Client) -> None:
    auth = _bearer(client.create_token("h", scopes=["enqueue"]))
    async_client = leaseq.AsyncClient(dsn, schema=schema)
    only = with_api(
        None, create_api(async_client, allowed_hosts=["testserver"]), close_client=async_client
    )
    with TestClient(only) as tc:
        assert tc.post("/api/v1/jobs", json={"task": "a"}, headers=auth).status_code == 201
        cross = {**auth, "origin": "https://evil.example"}
        assert tc.post("/api/v1/jobs", json={"task": "a"}, headers=cross).status_code == 403
        rebound = TestClient(only, base_url="http://evil.example")
        assert rebound.post("/api/v1/jobs", json={"task": "a"}, headers=auth).status_code == 421


def test_the_api_beside_the_dashboard(dsn: str, schema: str, client: leaseq.Client) -> None:
    async_client = leaseq.AsyncClient(dsn, schema=schema)
    dashboard = create_app(async_client, auth=BasicAuth("ops", "s3cret-long-one"))
    app = with_api(dashboard, create_api(async_client), close_client=async_client)
    token = client.create_token("both", scopes=["read"])
    with TestClient(app) as tc:
        assert tc.get("/", auth=("ops", "s3cret-long-one")).status_code == 200
        assert tc.get("/api/v1/queues", headers=_bearer(token)).status_code == 200
        # The dashboard's password is not an API credential, nor the token a dashboard one.
        assert tc.get("/api/v1/queues", auth=("ops", "s3cret-long-one")).status_code == 401
        assert tc.get("/", headers=_bearer(token)).status_code == 401


def test_the_openapi_document_matches_the_routes(api: TestClient) -> None:
    served = api.get("/api/v1/openapi.json")
    assert served.status_code == 200
    doc = json.loads(OPENAPI.read_text("utf-8"))
    assert served.json() == doc
    documented = {(path, method.upper()) for path, item in doc["paths"].items() for method in item}
    assert documented == {(path, method) for path, method, _ in ROUTES}
    app_routes = {
        (r.path.replace("{queue:path}", "{queue}").removeprefix("/api/v1"), m)
        for mount in api.app.routes  # type: ignore[attr-defined]
        for r in mount.routes
        for m in r.methods - {"HEAD"}
    }
    assert app_routes == documented
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            scope = operation["x-leaseq-scope"]
            assert (operation["security"] == []) == (scope is None), (path, method)
            assert scope is None or "401" in operation["responses"], (path, method)


def test_the_request_trail_ages_out_with_the_pruner(
    client: leaseq.Client, dsn: str, schema: str, api: TestClient
) -> None:
    from leaseq.worker.maintenance import Pruner
    from leaseq.worker.outage import Outage

    auth = _bearer(client.create_token("old", scopes=["read"]))
    for _ in range(3):
        assert api.get("/api/v1/queues", headers=auth).status_code == 200
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.api_requests SET at = now() - interval '2 days'"
                " WHERE id IN (SELECT min(id) FROM {}.api_requests)"
            ).format(sql.Identifier(schema), sql.Identifier(schema))
        )

    async def prune() -> None:
        async with leaseq.AsyncClient(dsn, schema=schema) as own:
            pruner = Pruner(
                own, Outage(), retention=86400.0, share=0.5, interval=60.0, timeout=30.0
            )
            await pruner.tick()

    asyncio.run(prune())
    assert len(client.api_requests(actor="old")) == 2


def test_a_jobs_cost_goes_through_the_http_api_and_a_bad_one_is_refused(
    client: leaseq.Client, api: TestClient, dsn: str, schema: str
) -> None:
    token = client.create_token("coster", scopes=["enqueue", "read"])
    made = api.post("/api/v1/jobs", json={"task": "render", "cost": 3}, headers=_bearer(token))
    assert made.status_code == 201, made.text
    job = made.json()["id"]
    assert _rows(dsn, schema, "SELECT cost FROM {s}.jobs WHERE id = %s", (job,)) == [(3,)]
    bad = api.post("/api/v1/jobs", json={"task": "render", "cost": 0}, headers=_bearer(token))
    assert bad.status_code == 400 and "cost must be" in bad.text, bad.text
