"""Side effects: idempotency keys, effect records with reconciliation, and fenced
transactional completion — seed test 4 with real processes killed mid-call."""

from __future__ import annotations

import asyncio
import json
import pathlib
import random
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from leaseq.params import default_idempotency_key
from tests.support.helpers import expire_lease, make_available, rows, run_sql, worker_sessions_gone
from tests.support.procs import WorkerProcess, wait_for

EFFECTS_APP = "tests.support.apps.effects:app"


class PaymentService:
    """A loopback HTTP service that charges at most once per Idempotency-Key and can say
    whether a key was charged. It counts every request it receives."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.charged: dict[str, int] = {}
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                key = self.headers["Idempotency-Key"]
                with service._lock:
                    service.requests.append(key)
                    first = key not in service.charged
                    if first:
                        service.charged[key] = len(service.charged) + 1
                    charge_id = service.charged[key]
                self._reply({"charge": charge_id, "replayed": not first})

            def do_GET(self) -> None:
                key = self.path.rsplit("/", 1)[-1]
                with service._lock:
                    self._reply({"acted": key in service.charged})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def service() -> Iterator[PaymentService]:
    svc = PaymentService()
    yield svc
    svc.close()


def _kill_mid_call_then_recover(
    dsn: str,
    schema: str,
    client: leaseq.Client,
    tmp_path: pathlib.Path,
    task: str,
    url: str,
) -> leaseq.Job:
    marker = tmp_path / f"{task}-called"
    job_id = client.enqueue(task, {"url": url, "marker": str(marker)})
    with WorkerProcess(
        dsn,
        schema,
        "--poll-interval",
        "0.05",
        log_dir=tmp_path,
        app=EFFECTS_APP,
    ) as a:
        wait_for(marker.exists, 30, "the first attempt to make its call")
        a.signal(signal.SIGKILL)  # after the call, before anything recorded it
        a.wait(10)
        wait_for(lambda: worker_sessions_gone(dsn, schema), 30, "its sessions to end")
    expire_lease(dsn, schema, job_id)
    with WorkerProcess(
        dsn,
        schema,
        "--drain",
        "--poll-interval",
        "0.05",
        "--sweep-interval",
        "0.1",
        log_dir=tmp_path,
        app=EFFECTS_APP,
    ) as b:
        assert b.wait(60) == 0, b.output()
    job = client.get_job(job_id)
    assert job is not None
    return job


def test_seed_4_idempotency_key_makes_the_retried_call_act_once(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, service: PaymentService
) -> None:
    job = _kill_mid_call_then_recover(dsn, schema, client, tmp_path, "pay_key_only", service.url)
    assert job.created_at is not None
    key = default_idempotency_key(job.job_id, job.created_at)
    assert job.status is JobStatus.SUCCEEDED and job.attempt_count == 2
    assert service.requests == [key, key], "the retry sent the very same key"
    assert service.charged == {key: 1}, "and the service acted once"


def test_seed_4_uncertain_effect_is_reconciled_not_repeated(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, service: PaymentService
) -> None:
    job = _kill_mid_call_then_recover(dsn, schema, client, tmp_path, "pay_reconciled", service.url)
    assert job.created_at is not None
    key = default_idempotency_key(job.job_id, job.created_at) + ":charge"
    assert job.status is JobStatus.SUCCEEDED
    assert service.requests == [key], "the reconcile hook asked; nobody called again"
    (effect,) = client.job_effects(job.job_id)
    assert (effect.name, effect.status, effect.attempt) == ("charge", "done", 1)


def test_seed_4_uncertain_effect_without_a_hook_stops_for_a_human(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, service: PaymentService
) -> None:
    job = _kill_mid_call_then_recover(
        dsn, schema, client, tmp_path, "pay_unreconciled", service.url
    )
    assert (job.status, job.last_error_code, job.last_error_class) == (
        JobStatus.DEAD,
        "UNCERTAIN_EFFECT",
        "permanent",
    )
    assert "no reconcile hook" in (job.last_error_detail or "")
    assert len(service.requests) == 1, "the safe default is to stop, not to repeat"
    (effect,) = client.job_effects(job.job_id)
    assert effect.status == "started"


def _app(dsn: str, schema: str) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=leaseq.RetryPolicy(base=0.001, cap=0.01))


def _ledger(dsn: str, schema: str) -> None:
    run_sql(dsn, "CREATE TABLE {s}.ledger (job_id bigint, token bigint, worker text)", schema)


async def test_stale_worker_commits_nothing_from_its_fenced_transaction(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    _ledger(dsn, schema)
    app = _app(dsn, schema)
    inside = asyncio.Event()
    gate = asyncio.Event()
    outcome: dict[str, Any] = {}

    @app.task(name="book")
    async def book(ctx: leaseq.JobContext, payload: Any) -> None:
        try:
            async with ctx.transaction() as conn:
                await conn.execute(
                    sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, 'A')").format(
                        sql.Identifier(schema)
                    ),
                    (ctx.job_id, ctx.fencing_token),
                )
                inside.set()
                await gate.wait()
        except leaseq.LeaseLost as exc:
            outcome["lost"] = str(exc)
            raise

    job_id = client.enqueue("book")
    worker = leaseq.Worker(app, leaseq.WorkerConfig(lease_seconds=30, poll_interval=0.05))
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(inside.wait(), 10)
    # A pauses inside its transaction; its lease runs out and B takes over and finishes.
    expire_lease(dsn, schema, job_id)
    client.sweep()
    make_available(dsn, schema)
    (b_lease,) = client.claim(worker="B")
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, 'B')").format(sql.Identifier(schema)),
            (job_id, b_lease.token),
        )
        assert client.complete(b_lease, connection=conn)
    gate.set()  # A resumes and tries to commit
    for _ in range(100):
        if "lost" in outcome:
            break
        await asyncio.sleep(0.05)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert "rolled back" in outcome["lost"]
    assert rows(dsn, "SELECT worker, token FROM {s}.ledger", schema) == [("B", 2)]
    assert stats.lost_leases == 1 and stats.succeeded == 0
    job = client.get_job(job_id)
    assert job is not None and (job.status, job.lease_token) == (JobStatus.SUCCEEDED, 2)


def test_sync_fenced_transaction_commits_writes_with_the_completion(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    _ledger(dsn, schema)
    app = _app(dsn, schema)

    @app.task(name="book_sync")
    def book_sync(ctx: leaseq.JobContext, payload: Any) -> None:
        with ctx.transaction() as conn:
            conn.execute(
                sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, %s)").format(sql.Identifier(schema)),
                (ctx.job_id, ctx.fencing_token, ctx.worker_id),
            )
        if payload.get("explode_after"):
            raise RuntimeError("after the commit: too late to matter")

    @app.task(name="book_then_fail")
    def book_then_fail(ctx: leaseq.JobContext, payload: Any) -> None:
        with ctx.transaction() as conn:
            conn.execute(
                sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, 'x')").format(
                    sql.Identifier(schema)
                ),
                (ctx.job_id, ctx.fencing_token),
            )
            raise leaseq.Permanent("REFUSED", "inside the transaction: rolls back")

    ok = client.enqueue("book_sync", {})
    late = client.enqueue("book_sync", {"explode_after": True})
    refused = client.enqueue("book_then_fail", {})
    config = leaseq.WorkerConfig(poll_interval=0.05, drain=True)
    stats = asyncio.run(leaseq.Worker(app, config).run())
    ledger = rows(dsn, "SELECT job_id FROM {s}.ledger ORDER BY job_id", schema)
    assert ledger == [(ok,), (late,)]
    assert {i: client.get_job(i).status for i in (ok, late, refused)} == {  # type: ignore[union-attr]
        ok: JobStatus.SUCCEEDED,
        late: JobStatus.SUCCEEDED,
        refused: JobStatus.DEAD,
    }
    assert stats.succeeded == 2


def test_concurrent_fenced_transactions_write_each_job_exactly_once(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Two workers, slow handlers, and a saboteur expiring leases mid-transaction: whatever
    happens, every job's write exists exactly once, under the token that completed it."""
    _ledger(dsn, schema)
    app = _app(dsn, schema)

    @app.task(name="write", renew="alive", max_attempts=20)
    async def write(ctx: leaseq.JobContext, payload: Any) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(
                sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, %s)").format(sql.Identifier(schema)),
                (ctx.job_id, ctx.fencing_token, ctx.worker_id),
            )
            await asyncio.sleep(random.uniform(0, 0.03))

    total = 400
    client.enqueue_many([{"task": "write"}] * total)
    stop = threading.Event()
    sabotaged = 0

    def saboteur() -> None:
        nonlocal sabotaged
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                cur = conn.execute(
                    sql.SQL(
                        "UPDATE {}.jobs SET lease_expires_at = now() - interval '1 s' "
                        "WHERE id IN (SELECT id FROM {}.jobs WHERE status = 'running' "
                        "ORDER BY random() LIMIT 2) RETURNING id"
                    ).format(sql.Identifier(schema), sql.Identifier(schema))
                )
                sabotaged += len(cur.fetchall())
                stop.wait(0.01)

    async def main() -> list[leaseq.WorkerStats]:
        config = leaseq.WorkerConfig(
            poll_interval=0.02, sweep_interval=0.05, drain=True, concurrency=8, lease_seconds=5
        )
        return await asyncio.gather(*(leaseq.Worker(app, config).run() for _ in range(2)))

    thread = threading.Thread(target=saboteur)
    thread.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        thread.join()
    assert sabotaged > 0, "no lease was broken: the test proved nothing"
    counts = rows(
        dsn,
        "SELECT j.status::text, count(l.job_id), bool_and(l.token = j.lease_token) "
        "FROM {s}.jobs j LEFT JOIN {s}.ledger l ON l.job_id = j.id GROUP BY j.id, j.status",
        schema,
    )
    assert len(counts) == total
    succeeded = [c for c in counts if c[0] == "succeeded"]
    assert all(n == 1 and same for _, n, same in succeeded), "a succeeded job wrote exactly once"
    assert all(n == 0 for status, n, _ in counts if status != "succeeded")


def test_completion_joined_to_the_handlers_own_transaction(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """`ctx.complete_in(conn)`: the shape for SQLAlchemy and other code that owns its
    transaction. A commit makes the job succeeded; a rollback is noticed and retried."""
    _ledger(dsn, schema)
    app = _app(dsn, schema)

    @app.task(name="own_tx", max_attempts=3)
    def own_tx(ctx: leaseq.JobContext, payload: Any) -> None:
        with psycopg.connect(dsn) as conn:
            conn.execute(
                sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, 'own')").format(
                    sql.Identifier(schema)
                ),
                (ctx.job_id, ctx.fencing_token),
            )
            ctx.complete_in(conn)
            if payload["roll_back_first"] and ctx.attempt == 1:
                conn.rollback()  # e.g. a later statement failed and the caller gave up
            else:
                conn.commit()

    commits = client.enqueue("own_tx", {"roll_back_first": False})
    rolls_back = client.enqueue("own_tx", {"roll_back_first": True})
    stats = asyncio.run(
        leaseq.Worker(app, leaseq.WorkerConfig(poll_interval=0.05, drain=True)).run()
    )
    assert rows(dsn, "SELECT job_id, token FROM {s}.ledger ORDER BY job_id", schema) == [
        (commits, 1),
        (rolls_back, 2),
    ]
    for job_id in (commits, rolls_back):
        job = client.get_job(job_id)
        assert job is not None and job.status is JobStatus.SUCCEEDED
    assert [e.error_code for e in client.job_events(rolls_back)] == ["COMPLETION_NOT_COMMITTED"]
    assert stats.succeeded == 2 and stats.lost_fence_writes == 0
