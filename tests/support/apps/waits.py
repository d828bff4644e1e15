"""Tasks for the durable sleep and signal crash tests: a step, a sleep or a wait for a
signal, another step; each step writes one ledger row through ``ctx.transaction()`` and
notes each run of its function in a file. The first attempt stops before the sleep or the
wait until the test writes the go file (so the test can pause it, or lock its row first)."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

from psycopg import sql

import leaseq

app = leaseq.App(retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


def _hold(ctx: leaseq.JobContext, payload: dict[str, Any]) -> None:
    if ctx.fencing_token != 1:
        return
    pathlib.Path(payload["dir"], "at").write_text("before the wait")
    go = pathlib.Path(payload["dir"], "go")
    while not go.exists():
        ctx.progress()
        time.sleep(0.05)


def _step(ctx: leaseq.JobContext, payload: dict[str, Any], name: str, value: Any = None) -> Any:
    def run() -> Any:
        with pathlib.Path(payload["dir"], "calls").open("a") as calls:
            calls.write(f"{name} {ctx.fencing_token} {os.getpid()}\n")
        with ctx.transaction() as conn:
            conn.execute(
                sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, %s)").format(
                    sql.Identifier(os.environ["LEASEQ_SCHEMA"])
                ),
                (ctx.job_id, name, ctx.fencing_token),
            )
        return value if value is not None else name

    return ctx.step(name, run)


@app.task(name="nap", store_result=True)
def nap(ctx: leaseq.JobContext, payload: dict[str, Any]) -> Any:
    try:
        _step(ctx, payload, "one")
        _hold(ctx, payload)
        ctx.sleep(payload["seconds"], name="nap")
        return _step(ctx, payload, "two")
    except leaseq.JobAborted as exc:
        if not isinstance(exc, leaseq.JobSuspended):
            pathlib.Path(payload["dir"], "lost").write_text(str(exc))
        raise


@app.task(name="approve", store_result=True)
def approve(ctx: leaseq.JobContext, payload: dict[str, Any]) -> Any:
    _step(ctx, payload, "one")
    _hold(ctx, payload)
    decision = ctx.wait_for("go", timeout=120)
    return _step(ctx, payload, "two", {"decision": decision})


@app.task(name="child", store_result=True)
def child(ctx: leaseq.JobContext, payload: dict[str, Any]) -> int:
    return int(payload["n"]) * 10


@app.task(name="fan", store_result=True)
def fan(ctx: leaseq.JobContext, payload: dict[str, Any]) -> Any:
    ids = ctx.spawn_many([("child", {"n": n}) for n in (1, 2, 3)])
    _hold(ctx, payload)  # the first attempt waits here, its children committed
    return sum(ctx.gather(ids, poll=0.1))


@app.task(name="flow", store_result=True)
def flow(ctx: leaseq.JobContext, payload: dict[str, Any]) -> Any:
    """Three steps around a sleep and a wait for a signal, for the restart test: each step's
    transaction stays open a little (so a restart can land inside one)."""

    def slow_step(name: str) -> Any:
        def run() -> str:
            with pathlib.Path(payload["dir"], "calls").open("a") as calls:
                calls.write(f"{name} {ctx.job_id} {ctx.fencing_token}\n")
            with ctx.transaction() as conn:
                conn.execute(
                    sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, %s)").format(
                        sql.Identifier(os.environ["LEASEQ_SCHEMA"])
                    ),
                    (ctx.job_id, name, ctx.fencing_token),
                )
                time.sleep(payload["hold"])
            return name

        return ctx.step(name, run)

    one = slow_step("one")
    ctx.sleep(payload["seconds"], name="nap")
    two = slow_step("two")
    decision = ctx.wait_for("go", timeout=300)
    three = slow_step("three")
    return [one, two, decision, three]


@app.task(name="slow_kid", store_result=True)
def slow_kid(ctx: leaseq.JobContext, payload: dict[str, Any]) -> int:
    with pathlib.Path(payload["dir"], "calls").open("a") as calls:
        calls.write(f"kid{payload['n']} {ctx.fencing_token} {os.getpid()}\n")
    go = pathlib.Path(payload["dir"], "go")
    while not go.exists():  # the test takes the parent's gate row first
        ctx.progress()
        time.sleep(0.05)
    return int(payload["n"]) * 10


@app.task(name="gatherer", store_result=True)
def gatherer(ctx: leaseq.JobContext, payload: dict[str, Any]) -> Any:
    ids = ctx.spawn_many([("slow_kid", {"n": n, "dir": payload["dir"]}) for n in (1, 2)])
    return ctx.gather(ids, poll=3600)  # only a child's end can wake it within the test


@app.task(name="approve_twice", store_result=True)
def approve_twice(ctx: leaseq.JobContext, payload: dict[str, Any]) -> Any:
    try:
        first = ctx.wait_for("ok", timeout=120)
        _hold(ctx, payload)  # the first attempt stops here, its first delivery recorded
        second = ctx.wait_for("ok", timeout=120)
        return [first, second, _step(ctx, payload, "after", "done")]
    except leaseq.JobAborted as exc:
        if not isinstance(exc, leaseq.JobSuspended):
            pathlib.Path(payload["dir"], "lost").write_text(str(exc))
        raise
