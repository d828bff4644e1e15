"""The autoscaling signal on a real PostgreSQL: the view's counts and suggested workers
(backlog, running, scheduled, blocked and waiting jobs, a pause, a queue limit, the
setting's bounds), the KEDA postgresql scaler's query exactly as docs/autoscaling.md
gives it, and the HTTP endpoint that docs/autoscaling.md's metrics-api scaler reads (the
real Starlette app, its guard and a bearer token), plus ``leaseq scaling``."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import warnings

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

from leaseq.web.api import create_api, with_api

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "autoscaling.md"


def _backlog(client: leaseq.Client) -> None:
    """emails: 24 claimable (one of them the head of an ordering key whose second job is
    blocked), 2 running, 1 scheduled later, 1 waiting for a dependency."""
    client.enqueue_many([{"task": "t", "queue": "emails"} for _ in range(25)])
    client.enqueue("t", queue="emails", ordering_key="k")
    client.enqueue("t", queue="emails", ordering_key="k")
    client.enqueue("t", queue="emails", delay=3600)
    leases = client.claim("emails", worker="w", limit=2)
    assert len(leases) == 2
    client.enqueue("t", queue="emails", depends_on=[leases[0].job_id])


def _one(client: leaseq.Client, queue: str = "emails") -> leaseq.QueueScaling:
    (row,) = client.autoscaling(queue)
    return row


def test_the_view_counts_what_a_worker_could_claim(client: leaseq.Client) -> None:
    _backlog(client)
    row = _one(client)
    assert (row.claimable, row.running, row.paused) == (24, 2, False)
    assert row.oldest_wait >= 0
    # ceil((24 + 2) / 10): WorkerConfig's default concurrency without a setting.
    assert (row.concurrency, row.suggested_workers) == (10, 3)
    client.set_scaling("emails", concurrency=4)
    assert _one(client).suggested_workers == 7
    client.set_scaling("emails", concurrency=4, max_workers=5)
    assert _one(client).suggested_workers == 5
    client.set_limit("queue:emails", concurrency=3)
    row = _one(client)
    assert (row.queue_limit, row.suggested_workers) == (3, 1)
    client.remove_limit("queue:emails")
    client.pause("emails", reason="maintenance")
    row = _one(client)
    # Paused: nothing is claimable, the running jobs still need their workers.
    assert (row.paused, row.claimable, row.suggested_workers) == (True, 0, 1)


def test_bounds_keep_a_queue_without_work_warm(client: leaseq.Client) -> None:
    assert client.autoscaling("idle") == []
    client.set_scaling("idle", concurrency=5, min_workers=2, max_workers=4)
    row = _one(client, "idle")
    assert (row.claimable, row.running, row.suggested_workers) == (0, 0, 2)
    assert client.clear_scaling("idle") is True
    assert client.autoscaling("idle") == []
    with pytest.raises(leaseq.ConfigError):
        client.set_scaling("idle", concurrency=0)
    with pytest.raises(leaseq.ConfigError):
        client.set_scaling("idle", concurrency=5, min_workers=3, max_workers=2)


def test_the_keda_postgresql_query_of_the_docs(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    found = re.search(r'query: "(SELECT [^"]+)"', DOC.read_text("utf-8"))
    assert found is not None, "docs/autoscaling.md lost its postgresql scaler query"
    query = found.group(1).replace("leaseq.autoscaling", "{}.autoscaling")
    run = sql.SQL(query).format(sql.Identifier(schema))  # type: ignore[arg-type]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(run).fetchone() == (0,)  # no row yet: still a number
        _backlog(client)
        assert conn.execute(run).fetchone() == (3,)


def test_the_metrics_api_endpoint_of_the_docs(client: leaseq.Client, dsn: str, schema: str) -> None:
    text = DOC.read_text("utf-8")
    url = re.search(r'url: "http://[^/]+(/api/v1/autoscaling/emails)"', text)
    location = re.search(r'valueLocation: "(\w+)"', text)
    assert url is not None and location is not None
    _backlog(client)
    token = client.create_token("keda", scopes=["read"], queues=["emails", "idle"])
    auth = {"authorization": f"Bearer {token}"}
    app = with_api(None, create_api(leaseq.AsyncClient(dsn, schema=schema), close_client=True))
    with TestClient(app) as tc:
        assert tc.get(url.group(1)).status_code == 401
        answer = tc.get(url.group(1), headers=auth)
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json()[location.group(1)] == 3
        assert answer.json()["claimable"] == 24
        idle = tc.get("/api/v1/autoscaling/idle", headers=auth).json()
        assert (idle["queue"], idle["suggested_workers"]) == ("idle", 0)
        every = tc.get("/api/v1/autoscaling", headers=auth).json()
        assert [q["queue"] for q in every["queues"]] == ["emails"]
        assert tc.get("/api/v1/autoscaling/other", headers=auth).status_code == 403


def test_leaseq_scaling_commands(client: leaseq.Client, dsn: str, schema: str) -> None:
    base = ["--dsn", dsn, "--schema", schema]
    runner = CliRunner()
    done = runner.invoke(
        cli, [*base, "scaling", "set", "emails", "--concurrency", "4", "--max", "9"]
    )
    assert done.exit_code == 0, done.output
    assert "4 per worker" in done.output
    shown = runner.invoke(cli, [*base, "scaling", "show", "--json"])
    assert shown.exit_code == 0 and '"suggested_workers": 0' in shown.output
    bad = subprocess.run(
        [sys.executable, "-m", "leaseq", *base, "scaling", "set", "emails", "--concurrency", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0
    assert (
        bad.stderr.strip().splitlines() == ["error: concurrency must be between 1 and 10000, got 0"]
        or len(bad.stderr.strip().splitlines()) == 1
    ), bad.stderr
