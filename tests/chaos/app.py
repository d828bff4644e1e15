"""The chaos run's tasks: ``leaseq worker tests.chaos.app:app``.

Each handler works for a while (calling ``ctx.progress()`` between steps), then writes one
row to ``chaos_effects`` through ``ctx.transaction()``, so the row and the job's fenced
completion commit together or not at all.

Every *execution* (an attempt that reached the handler) is also recorded outside any
transaction, in a file per worker process (``exec-<pid>.log`` in the payload's ``out``
directory), written with one ``write(2)`` per line on an ``O_APPEND`` descriptor, so a line
survives ``kill -9`` of the process right after it:

``S <job> <token> <pid> <owner> <start>`` when the handler starts,
``T <job> <token> <pid> <owner> <tx>`` when it enters the fenced transaction, and
``E <job> <token> <pid> <owner> <start> <tx> <end> <outcome>`` when it stops, where ``owner``
is the claim's ``lease_owner`` (``<worker id>/<nonce>.<n>``: one per claim), ``tx``
is when it entered the fenced transaction (``-`` if it never did) and ``outcome`` one of
``committed``, ``lease_lost`` (LeaseLost: the fence refused, or progress() said so),
``cancelled`` (the worker cancelled an async handler), ``retry`` / ``poison`` (raised on
purpose), or ``error:<ExceptionType>`` (then its message follows, on one line). Times are
``time.time()``.

Payload: ``seq`` (the job's number in the run), ``n`` steps of ``s`` seconds, ``mode``
(``ok``; ``flaky``: raise ``Retry`` on the first attempt; ``poison``: raise ``Permanent``),
``out`` (the directory for the execution logs).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import psycopg
import psycopg_pool
from psycopg import sql

import leaseq

EFFECTS_TABLE = "chaos_effects"
MAX_ATTEMPTS = 25
POISON_CODE = "CHAOS_POISON"
FLAKY_CODE = "CHAOS_FLAKY"

#: A handler's database errors (connection lost, backend terminated, server restarting) are
#: worth retrying; without these rules they would be "unknown" and spend a budget of 3.
#: DatabaseUnavailable is leaseq's own: ``ctx.transaction()`` in a sync handler raises it
#: when the worker's handler pool is first opened while the server is unreachable.
app = leaseq.App(
    retry_policy=leaseq.RetryPolicy(base=0.05, cap=0.5),
    error_rules={
        leaseq.DatabaseUnavailable: "transient",
        psycopg.OperationalError: "transient",
        psycopg.InterfaceError: "transient",
        psycopg_pool.PoolTimeout: "transient",
        OSError: "transient",
        TimeoutError: "transient",
    },
)

_fds: dict[str, int] = {}
_fds_lock = threading.Lock()


def effects_ddl(schema: str) -> sql.Composed:
    """The table the fenced transactions write to (no unique key: duplicates must show)."""
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {}.{} ("
        " job_id bigint NOT NULL, token bigint NOT NULL, worker text NOT NULL,"
        " pid integer NOT NULL, seq integer NOT NULL, exec_start double precision NOT NULL,"
        " written_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    ).format(sql.Identifier(schema), sql.Identifier(EFFECTS_TABLE))


def _write_line(out: str, fields: tuple[object, ...]) -> None:
    with _fds_lock:
        fd = _fds.get(out)
        if fd is None:
            path = os.path.join(out, f"exec-{os.getpid()}.log")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            _fds[out] = fd
    os.write(fd, ("\t".join(str(f) for f in fields) + "\n").encode())


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, leaseq.JobAborted):
        return "lease_lost" if isinstance(exc, leaseq.LeaseLost) else f"aborted:{exc.reason}"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, leaseq.Permanent):
        return "poison"
    if isinstance(exc, leaseq.Retry):
        return "retry"
    return f"error:{type(exc).__name__}"


class _Execution:
    """One execution's record, and what it is asked to do."""

    def __init__(self, ctx: leaseq.JobContext, payload: Any) -> None:
        self.ctx = ctx
        self.payload = payload
        self.out = str(payload["out"])
        self.steps = int(payload["n"])
        self.step = float(payload["s"])
        self.start = time.time()
        self.tx: float | None = None
        self.outcome = "unknown"
        self.detail = ""
        # The claim's whole lease_owner (worker id, process nonce, claim number): it names
        # one claim, so two executions under one token are told apart even in one process.
        self.ident = (ctx.job_id, ctx.fencing_token, os.getpid(), ctx.lease.owner)
        _write_line(self.out, ("S", *self.ident, f"{self.start:.6f}"))

    def misbehave(self) -> None:
        """Raise on purpose, after the work, as a buggy or unlucky handler would."""
        mode = self.payload.get("mode", "ok")
        if mode == "poison":
            raise leaseq.Permanent(POISON_CODE, "poison job, by design of the chaos run")
        if mode == "flaky" and self.ctx.attempt == 1:
            raise leaseq.Retry(FLAKY_CODE, retry_in=0.05)

    def insert(self) -> tuple[sql.Composed, tuple[object, ...]]:
        self.tx = time.time()
        _write_line(self.out, ("T", *self.ident, f"{self.tx:.6f}"))
        query = sql.SQL(
            "INSERT INTO {}.{} (job_id, token, worker, pid, seq, exec_start) "
            "VALUES (%s, %s, %s, %s, %s, %s)"
        ).format(sql.Identifier(app.schema), sql.Identifier(EFFECTS_TABLE))
        job_id, token, pid, worker = self.ident
        return query, (job_id, token, worker, pid, int(self.payload["seq"]), self.start)

    def failed(self, exc: BaseException) -> None:
        self.outcome = _outcome(exc)
        if self.outcome.startswith("error:"):
            self.detail = " ".join(str(exc).split())[:300]

    def finish(self) -> None:
        tx = "-" if self.tx is None else f"{self.tx:.6f}"
        end = f"{time.time():.6f}"
        fields = ("E", *self.ident, f"{self.start:.6f}", tx, end, self.outcome, self.detail)
        _write_line(self.out, fields)


@app.task(name="chaos.async", max_attempts=MAX_ATTEMPTS)
async def chaos_async(ctx: leaseq.JobContext, payload: Any) -> None:
    run = _Execution(ctx, payload)
    try:
        for _ in range(run.steps):
            ctx.progress()
            await asyncio.sleep(run.step)
        ctx.progress()
        run.misbehave()
        query, params = run.insert()
        async with ctx.transaction() as conn:
            await conn.execute(query, params)
        run.outcome = "committed"
    except BaseException as exc:
        run.failed(exc)
        raise
    finally:
        run.finish()


@app.task(name="chaos.sync", max_attempts=MAX_ATTEMPTS)
def chaos_sync(ctx: leaseq.JobContext, payload: Any) -> None:
    run = _Execution(ctx, payload)
    try:
        for _ in range(run.steps):
            ctx.progress()
            time.sleep(run.step)
        ctx.progress()
        run.misbehave()
        query, params = run.insert()
        with ctx.transaction() as conn:
            conn.execute(query, params)
        run.outcome = "committed"
    except BaseException as exc:
        run.failed(exc)
        raise
    finally:
        run.finish()


# -- the capability workloads' tasks (tests/chaos/caps/) --------------------------------------
#
# One handler for all of them: the payload says how long to work and how to misbehave, and
# ``out`` the directory of their execution logs (the same S/E lines as above). A batch
# callback's payload nests the signature's own under "payload". The result task returns the
# token it ran under, so a stored result names the attempt that wrote it.

CAP_QUEUE = "chaos-q"  # under a queue limit (tests/chaos/caps/limits.py)
UNIQUE_QUEUE = "chaos-u"  # the unique keys' jobs (tests/chaos/caps/unique.py)
#: The task and key limits' jobs: a backlog held back by a limit fills the claim's window
#: of candidates (docs/limits.md), which would hold back other capabilities' jobs.
LIMITED_QUEUE = "chaos-l"
CAP_QUEUES = (CAP_QUEUE, UNIQUE_QUEUE, LIMITED_QUEUE)


def _cap_payload(payload: Any) -> Any:
    if isinstance(payload, dict) and "batch_id" in payload and "kind" in payload:
        return payload["payload"]
    return payload


async def _cap_run(ctx: leaseq.JobContext, payload: Any) -> dict[str, int]:
    run = _Execution(ctx, _cap_payload(payload))
    try:
        for _ in range(run.steps):
            ctx.progress()
            await asyncio.sleep(run.step)
        ctx.progress()
        run.misbehave()
        run.outcome = "returned"
        return {"token": ctx.fencing_token, "job": ctx.job_id}
    except BaseException as exc:
        run.failed(exc)
        raise
    finally:
        run.finish()


def _cap_task(name: str, **options: Any) -> None:
    async def handler(ctx: leaseq.JobContext, payload: Any) -> dict[str, int]:
        return await _cap_run(ctx, payload)

    app.task(name=name, max_attempts=MAX_ATTEMPTS, **options)(handler)


_cap_task("chaos.cap")
_cap_task("chaos.cap.result", store_result=True)
_cap_task("chaos.cap.limited", queue=LIMITED_QUEUE)
_cap_task("chaos.cap.flap", queue=LIMITED_QUEUE)
_cap_task("chaos.cap.tenant", queue=LIMITED_QUEUE)
_cap_task("chaos.cap.queued", queue=CAP_QUEUE)
_cap_task("chaos.cap.unique", queue=UNIQUE_QUEUE)

#: The ledger the durable steps write to inside their step (no unique key: a step that ran
#: twice shows as two rows).
STEPS_TABLE = "chaos_steps"
STEPS = ("reserve", "charge", "notify")


def steps_ddl(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {}.{} (job_id bigint NOT NULL, step text NOT NULL,"
        " token bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    ).format(sql.Identifier(schema), sql.Identifier(STEPS_TABLE))


@app.task(name="chaos.cap.steps", max_attempts=MAX_ATTEMPTS)
async def chaos_steps(ctx: leaseq.JobContext, payload: Any) -> None:
    """Three durable steps, each writing its ledger row through ctx.transaction() (which
    commits with the step's record), with work between them: a fault between two steps
    makes the next attempt start from the first step without a record."""
    run = _Execution(ctx, payload)
    query = sql.SQL("INSERT INTO {}.{} (job_id, step, token) VALUES (%s, %s, %s)").format(
        sql.Identifier(app.schema), sql.Identifier(STEPS_TABLE)
    )

    def step(name: str) -> Any:
        async def write() -> str:
            async with ctx.transaction() as conn:
                await conn.execute(query, (ctx.job_id, name, ctx.fencing_token))
            return name

        return write

    try:
        for name in STEPS:
            for _ in range(run.steps):
                ctx.progress()
                await asyncio.sleep(run.step)
            await ctx.step_async(name, step(name))
        run.misbehave()
        run.outcome = "returned"
    except BaseException as exc:
        run.failed(exc)
        raise
    finally:
        run.finish()


@app.task(name="chaos.cap.waits", max_attempts=MAX_ATTEMPTS, store_result=True)
async def chaos_waits(ctx: leaseq.JobContext, payload: Any) -> Any:
    """A step, a durable sleep, a wait for the signal "go", a second step: each run after a
    suspension starts again from the top, the steps answered from their records. Returns
    the signal's payload (stored), so the end check sees which signal the job got."""
    run = _Execution(ctx, payload)
    query = sql.SQL("INSERT INTO {}.{} (job_id, step, token) VALUES (%s, %s, %s)").format(
        sql.Identifier(app.schema), sql.Identifier(STEPS_TABLE)
    )

    def step(name: str) -> Any:
        async def write() -> str:
            async with ctx.transaction() as conn:
                await conn.execute(query, (ctx.job_id, name, ctx.fencing_token))
            return name

        return write

    try:
        await ctx.step_async("before", step("before"))
        await ctx.sleep_async(float(payload["sleep"]))
        got = await ctx.wait_for_async("go", timeout=600)
        for _ in range(run.steps):
            ctx.progress()
            await asyncio.sleep(run.step)
        await ctx.step_async("after", step("after"))
        run.outcome = "returned"
        return got
    except BaseException as exc:
        run.failed(exc)
        raise
    finally:
        run.finish()
