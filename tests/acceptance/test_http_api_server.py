"""`leaseq web` serving the HTTP API for real (uvicorn, a process of its own): beside the
dashboard, and alone (--api-only), a token made by `leaseq tokens create` enqueuing over
TCP, the dashboard's password refused by the API and the token by the dashboard."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import leaseq
from tests.support.ports import free_port

pytest.importorskip("uvicorn")

USER, PASSWORD = "ops", "a-long-enough-password"


def _serve(dsn: str, schema: str, *extra: str) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "LEASEQ_DSN": dsn,
        "LEASEQ_SCHEMA": schema,
        "LEASEQ_WEB_USER": USER,
        "LEASEQ_WEB_PASSWORD": PASSWORD,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "leaseq", "web", "--port", str(port), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    pytest.fail(f"leaseq web did not start: {out}")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _call(url: str, headers: dict[str, str], body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
            kind = answer.headers.get("content-type", "")
            return answer.status, json.loads(raw) if "json" in kind else raw.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _basic() -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}


@pytest.mark.parametrize("api_only", [False, True])
def test_leaseq_web_serves_the_api(
    dsn: str, schema: str, client: leaseq.Client, api_only: bool
) -> None:
    token = client.create_token("svc", scopes=["enqueue", "read"], queues=["emails"])
    bearer = {"authorization": f"Bearer {token}"}
    served = _serve(dsn, schema, *(["--api-only"] if api_only else []))
    base = next(served)
    try:
        status, made = _call(
            f"{base}/api/v1/jobs", bearer, {"task": "emails.send", "queue": "emails"}
        )
        assert status == 201, made
        job = client.get_job(made["id"])
        assert job is not None and job.queue == "emails"
        status, doc = _call(f"{base}/api/v1/openapi.json", {})
        assert status == 200 and doc["openapi"].startswith("3.")
        assert _call(f"{base}/api/v1/queues", _basic())[0] == 401
        dashboard = _call(f"{base}/", _basic())[0]
        assert dashboard == (404 if api_only else 200)
        if not api_only:
            assert _call(f"{base}/", bearer)[0] == 401
        trail = client.api_requests(actor="svc")
        assert [r["path"] for r in trail] == ["/api/v1/jobs"]
    finally:
        next(served, None)
