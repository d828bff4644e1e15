"""The Node.js client (clients/node, over the SQL API) against a real PostgreSQL: its own
suite (`npm test`, node's test runner) in a freshly migrated schema, given the parity
cases of tests/integration/test_sql_api_parity.py with the verdict Python's client gave
each (so Node refuses exactly what Python refuses), and a job enqueued from Node, run by a
Python worker, its result read back from Node."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pathlib
import subprocess
from typing import Any

import pytest

import leaseq
from leaseq.errors import LeaseqError
from tests.integration.test_sql_api_parity import BATCH, PARENT, _fill, _jobs, _python
from tests.support.requires import tool_path

NODE_DIR = pathlib.Path(__file__).resolve().parents[2] / "clients" / "node"

pytestmark = pytest.mark.slow


@pytest.fixture()
def node_schema(second_client: leaseq.Client) -> leaseq.Client:
    return second_client


def _npm(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool_path("npm"), *args],
        cwd=NODE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _installed(env: dict[str, str]) -> None:
    """`npm ci` (the lock file's versions) once per checkout."""
    if (NODE_DIR / "node_modules" / "pg").is_dir() and (
        NODE_DIR / "node_modules" / "typescript"
    ).is_dir():
        return
    done = _npm(["ci", "--no-audit", "--no-fund"], env, 600)
    assert done.returncode == 0, done.stdout + done.stderr


def _json_ready(job: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in job.items()}


def _integral_float(value: Any) -> bool:
    """2.0: Python refuses it as a priority, but a JavaScript number cannot tell it from 2
    (JSON.parse reads both as 2), so such a case has no Node form."""
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, list | tuple):
        return any(_integral_float(v) for v in value)
    if isinstance(value, dict):
        return any(_integral_float(v) for v in value.values())
    return False


def _cases(client: leaseq.Client, node: leaseq.Client) -> list[dict[str, Any]]:
    """Each parity case with Python's verdict, its ids filled in for Node's schema (all
    but those JavaScript cannot write, :func:`_integral_float`)."""
    parents = (client.enqueue("parent"), node.enqueue("parent"))
    out = []
    for label, spec, _ in _jobs():
        wants_batch = spec.get("batch_id") == BATCH
        batches = (client.create_batch(), node.create_batch()) if wants_batch else (0, 0)
        job = {k: _fill(v, parents[0], batches[0]) for k, v in spec.items()}
        node_job = {k: _fill(v, parents[1], batches[1]) for k, v in spec.items()}
        if _integral_float(job):
            continue
        verdict: type[LeaseqError] | None = _python(client, job)
        expect = None if verdict is None else verdict.__name__
        out.append({"label": label, "job": _json_ready(node_job), "expect": expect})
    assert PARENT and out
    return out


def test_the_node_client_suite_and_a_job_across_languages(
    client: leaseq.Client, dsn: str, node_schema: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    tool_path("node")
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(_cases(client, node_schema)), "utf-8")
    env = {
        **os.environ,
        "LEASEQ_TEST_DSN": dsn,
        "LEASEQ_TEST_SCHEMA": node_schema.schema,
        "LEASEQ_PARITY_CASES": str(cases),
    }
    _installed(env)
    suite = _npm(["test"], env, 600)
    assert suite.returncode == 0, suite.stdout[-4000:] + suite.stderr[-4000:]
    assert "# fail 0" in suite.stdout and "# pass 6" in suite.stdout, suite.stdout[-2000:]

    node = tool_path("node")
    script = str(NODE_DIR / "dist" / "test" / "roundtrip.js")
    made = subprocess.run(
        [node, script, "enqueue"], env=env, capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    job_id = int(made.stdout.strip())

    app = leaseq.App(dsn, schema=node_schema.schema)

    @app.task(name="add", store_result=True)
    def add(ctx: leaseq.JobContext, payload: dict[str, int]) -> int:
        return payload["a"] + payload["b"]

    try:
        config = leaseq.WorkerConfig(queues=["node"], poll_interval=0.05, drain=True)
        asyncio.run(leaseq.Worker(app, config).run())
    finally:
        app.client.close()
    read = subprocess.run(
        [node, script, "result", str(job_id)], env=env, capture_output=True, text=True, timeout=60
    )
    assert read.returncode == 0, read.stderr
    outcome = json.loads(read.stdout)
    assert (outcome["status"], outcome["stored"], outcome["value"]) == ("succeeded", True, 5)
