"""Fan-out with results (``ctx.spawn``, ``ctx.spawn_many``, ``ctx.gather``;
docs/durable.md), built on steps and durable waits.

A spawn is a step whose function enqueues the children through the step's transaction and
records them in ``job_children`` there: the children, the rows naming them and the step's
record commit together, so a parent that reruns gets their ids from the record and never
spawns them twice. A gather looks at the children's states; while one is unfinished the
parent is suspended (reason ``children``: no lease, slot or connection) until the end of
its last child wakes it (the database does, in that end's transaction: migration 31), or
``poll`` seconds pass (a fallback); once all have ended, a step records their results, which every
rerun gets back. A child that ended dead or cancelled raises :class:`ChildFailed` unless
``return_failures`` is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leaseq.codes import ErrorCode
from leaseq.errors import Permanent
from leaseq.models import JobResult
from leaseq.worker.aborts import JobSuspended, aborted, lease_lost
from leaseq.worker.waits import check_suspendable

if TYPE_CHECKING:
    from leaseq.worker.context import JobContext

#: A child to spawn: (task, payload, enqueue options).
ChildSpec = tuple[str, Any, dict[str, Any]]
FINISHED = ("succeeded", "dead", "cancelled")


class ChildFailed(Permanent):
    """``ctx.gather``: a child ended dead or cancelled (or is gone). Uncaught, the parent
    ends dead with ``CHILD_FAILED``."""

    def __init__(self, child: int, status: str | None, detail: str | None) -> None:
        super().__init__(
            ErrorCode.CHILD_FAILED,
            f"child job {child} ended {status or 'gone'}" + (f": {detail}" if detail else ""),
        )
        self.child = child


def spawn_name(ctx: JobContext, name: str | None, kind: str) -> str:
    return name if name is not None else f"{kind}-{ctx._steps.position + 1}"


def _results(found: list[JobResult | None], children: list[int], failures: bool) -> list[Any]:
    out: list[Any] = []
    for child, result in zip(children, found, strict=True):
        status = result.status if result is not None else None
        if status != "succeeded" and not failures:
            raise ChildFailed(child, status, result.error_detail if result else None)
        if failures:
            out.append(None if result is None else result.as_dict())
        else:
            out.append(result.value if result is not None else None)
    return out


def _unfinished(ctx: JobContext, states: list[str | None]) -> bool:
    """Some child is still pending, running or suspended (a gone one counts as ended)."""
    if not any(s is not None and s not in FINISHED for s in states):
        return False
    check_suspendable(ctx.lease, "wait for its children")
    return True


def _suspend_outcome(ctx: JobContext, decision: Any) -> None:
    if decision == "ready":  # every child ended meanwhile: no suspension
        return
    if decision == "lost":
        ctx.abort(ErrorCode.LEASE_LOST)
        raise lease_lost(ctx.lease, "lease lost at a gather")
    if decision == "cancel":
        ctx.abort(ErrorCode.CANCELLED)
        raise aborted(ctx.lease, ErrorCode.CANCELLED)
    ctx._mark_suspended()
    raise JobSuspended("SUSPENDED", f"job {ctx.job_id} waits for its children")


def run_spawn(ctx: JobContext, name: str, children: list[ChildSpec]) -> list[int]:
    client = ctx._sync()

    def enqueue_all() -> list[int]:
        with ctx.transaction() as conn:
            ids = [int(client.enqueue(t, p, connection=conn, **o)) for t, p, o in children]
            client.children_record(ctx.job_id, name, ids, conn)
        return ids

    return list(ctx.step(name, enqueue_all))


async def run_spawn_async(ctx: JobContext, name: str, children: list[ChildSpec]) -> list[int]:
    client = ctx._async()

    async def enqueue_all() -> list[int]:
        async with ctx.transaction() as conn:
            ids = [int(await client.enqueue(t, p, connection=conn, **o)) for t, p, o in children]
            await client.children_record(ctx.job_id, name, ids, conn)
        return ids

    return list(await ctx.step_async(name, enqueue_all))


def run_gather(
    ctx: JobContext, name: str, children: list[int], poll: float, failures: bool
) -> list[Any]:
    client = ctx._sync()
    book = ctx._steps
    if book.records is None:
        book.load([] if ctx.lease.token == 1 else client.step_records(ctx.job_id))
    record = book.records.get(name) if book.records else None
    if record is None and _unfinished(ctx, client.children_states(children)):
        decision, _ = client.wait_point(
            ctx.lease, record=name, until=None, signal=None, poll=poll, children=children
        )
        _suspend_outcome(ctx, decision)
    found = None if record is not None else [client.job_result(c) for c in children]
    return list(ctx.step(name, lambda: _results(found or [], children, failures)))


async def run_gather_async(
    ctx: JobContext, name: str, children: list[int], poll: float, failures: bool
) -> list[Any]:
    client = ctx._async()
    book = ctx._steps
    if book.records is None:
        book.load([] if ctx.lease.token == 1 else await client.step_records(ctx.job_id))
    record = book.records.get(name) if book.records else None
    if record is None and _unfinished(ctx, await client.children_states(children)):
        decision, _ = await client.wait_point(
            ctx.lease, record=name, until=None, signal=None, poll=poll, children=children
        )
        _suspend_outcome(ctx, decision)
    found = None if record is not None else [await client.job_result(c) for c in children]
    return list(await ctx.step_async(name, lambda: _results(found or [], children, failures)))
