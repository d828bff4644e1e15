"""The lease keeper's renewal against an attempt that finishes while the renewal is in
flight: the keeper polices only attempts that are not yet reporting."""

from __future__ import annotations

import asyncio
import time

import leaseq
from leaseq.codes import ErrorCode
from leaseq.metrics import WorkerMetrics
from leaseq.worker.completer import Completer
from leaseq.worker.context import JobContext
from leaseq.worker.executor import Executor
from leaseq.worker.inflight import InFlight, Running, WorkerEvents, WorkerStats
from leaseq.worker.leases import LeaseKeeper
from leaseq.worker.outage import Outage
from tests.support.helpers import expire_lease


async def test_renewal_finding_a_lost_lease_leaves_an_attempt_already_reporting_alone(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The boundary: a renewal is sent, the handler returns and its outcome goes to the
    completer, then the renewal comes back "lost". The keeper used to abort that attempt
    anyway, so one lost lease was counted twice (the abort, then the completion the fence
    refused): seen as "2 lost lease(s)" from a worker resumed after SIGSTOP. An attempt
    still running under the same lost lease is aborted as before."""
    reporting_id = client.enqueue("noop")
    running_id = client.enqueue("noop")
    aclient = leaseq.AsyncClient(dsn, schema=schema)
    try:
        leases = await aclient.claim(worker="a", lease_seconds=30, limit=2)
        assert {x.job_id for x in leases} == {reporting_id, running_id}
        for job_id in (reporting_id, running_id):
            expire_lease(dsn, schema, job_id)  # the renewal's fence will refuse both
        stats = WorkerStats()
        inflight = InFlight(WorkerEvents(stats, WorkerMetrics()))
        attempts = {}
        for lease in leases:
            attempt = Running(lease, JobContext(lease, "a"), None, time.monotonic() + 30)
            attempt.started_at = time.monotonic()
            inflight.add(attempt)
            attempts[lease.job_id] = attempt
        attempts[reporting_id].reporting = True  # its outcome is on its way
        keeper = LeaseKeeper(leaseq.WorkerConfig(), aclient, inflight, Outage())
        await keeper._renew(1.0)
    finally:
        await aclient.close()
    assert attempts[reporting_id].ctx.aborted is None
    assert attempts[running_id].ctx.aborted == "LEASE_LOST"
    assert stats.lost_leases == 1 and stats.aborted == {"LEASE_LOST": 1}


async def test_an_attempt_aborted_before_its_task_first_ran_leaves_the_worker(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The boundary: the keeper finds a lease lost between ``Executor.start`` creating the
    attempt's task and that task's first step (a claim that returned late on a loaded
    machine). A task cancelled before its first step never enters its coroutine, so its
    cleanup never ran: the attempt stayed in flight for ever and the worker's stop waited
    for it until its shutdown timeout (seen in CI as a stop that took over 10 s)."""
    app = leaseq.App(dsn, schema=schema)
    ran: list[int] = []

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: object) -> None:
        ran.append(ctx.fencing_token)

    client.enqueue("noop")
    aclient = leaseq.AsyncClient(dsn, schema=schema)
    stats = WorkerStats()
    inflight = InFlight(WorkerEvents(stats, WorkerMetrics()))
    executor = Executor(app, leaseq.WorkerConfig(), aclient, inflight, Completer(aclient), Outage())
    try:
        (lease,) = await aclient.claim(worker="a", lease_seconds=30, limit=1)
        executor.start(lease, time.monotonic() + 30)
        (running,) = inflight.all()
        inflight.abort(running, ErrorCode.LEASE_LOST)  # before the task's first step
        for _ in range(3):
            await asyncio.sleep(0)
        assert not inflight, "the aborted attempt was left in flight"
        assert ran == [] and stats.lost_leases == 1
    finally:
        await executor.close()
        await aclient.close()
