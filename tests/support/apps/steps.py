"""Tasks for the durable-step crash tests: three steps, each writing one ledger row through
``ctx.transaction()`` and noting each run of its function in a file; the first attempt
stops at the point the payload names (before, inside or after the second step) and waits
there for the test's kill -9, or for SIGSTOP, a lapsed lease, SIGCONT and a go file."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

from psycopg import sql

import leaseq

app = leaseq.App(retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


def _hold(ctx: leaseq.JobContext, payload: dict[str, Any], point: str) -> None:
    if ctx.fencing_token != 1 or payload["point"] != point:
        return
    pathlib.Path(payload["dir"], "at").write_text(point)
    go = pathlib.Path(payload["dir"], "go")
    while not go.exists():  # progress keeps the lease renewed until the process is paused
        ctx.progress()
        time.sleep(0.05)


def _step(ctx: leaseq.JobContext, payload: dict[str, Any], name: str) -> Any:
    def run() -> str:
        with pathlib.Path(payload["dir"], "calls").open("a") as calls:
            calls.write(f"{name} {ctx.fencing_token} {os.getpid()}\n")
        with ctx.transaction() as conn:
            conn.execute(
                sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, %s)").format(
                    sql.Identifier(os.environ["LEASEQ_SCHEMA"])
                ),
                (ctx.job_id, name, ctx.fencing_token),
            )
        if name == "two":
            _hold(ctx, payload, "inside")  # written, not committed: it commits with the record
        return f"{name}@{ctx.fencing_token}"

    return ctx.step(name, run)


@app.task(name="three_steps", store_result=True)
def three_steps(ctx: leaseq.JobContext, payload: dict[str, Any]) -> Any:
    try:
        one = _step(ctx, payload, "one")
        _hold(ctx, payload, "before")
        two = _step(ctx, payload, "two")
        _hold(ctx, payload, "after")
        three = _step(ctx, payload, "three")
    except leaseq.JobAborted as exc:
        pathlib.Path(payload["dir"], "lost").write_text(str(exc))
        raise
    return [one, two, three]


def _pure(ctx: leaseq.JobContext, payload: dict[str, Any], name: str) -> Any:
    """A step without a transaction of its own: its record goes through the worker's group
    commit, in one write with other jobs' records."""

    def run() -> str:
        with pathlib.Path(payload["dir"], "calls").open("a") as calls:
            calls.write(f"{name} {ctx.fencing_token} {os.getpid()}\n")
        if name == "two":
            _hold(ctx, payload, "inside")  # the function runs, nothing is recorded yet
        return f"{name}@{ctx.fencing_token}"

    return ctx.step(name, run)


@app.task(name="pure_steps", store_result=True)
def pure_steps(ctx: leaseq.JobContext, payload: dict[str, Any]) -> Any:
    try:
        one = _pure(ctx, payload, "one")
        _hold(ctx, payload, "before")
        two = _pure(ctx, payload, "two")
        _hold(ctx, payload, "after")  # two's record committed before the handler got here
        three = _pure(ctx, payload, "three")
    except leaseq.JobAborted as exc:
        pathlib.Path(payload["dir"], "lost").write_text(str(exc))
        raise
    return [one, two, three]
