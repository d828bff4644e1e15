"""External side effects done right: durable effect records and fenced transactions.

Three tools, three guarantees (README, "Side effects"):

- ``ctx.transaction()``: writes to *this* database commit atomically with the job's fenced
  completion, or not at all — a stale worker's writes vanish with its rollback.
- ``ctx.idempotency_key`` / ``ctx.effect_key(...)``: stable across attempts, for external
  systems that deduplicate by key.
- ``ctx.effect(name, fn)``: the call is recorded as *started* before and *done* after. A
  later attempt that finds it started but not done knows the outcome is *uncertain*, and
  asks the task's reconcile hook instead of blindly calling again.

The effect protocol is written once, as a generator of steps (``effect_flow``); the sync and
async drivers below only carry the steps out with the matching client.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from leaseq import validate
from leaseq.codes import ErrorCode
from leaseq.errors import PayloadError, Permanent
from leaseq.models import EffectRecord, Lease
from leaseq.worker.aborts import LeaseLost, lease_lost

if TYPE_CHECKING:
    from leaseq.client import Client
    from leaseq.client_async import AsyncClient


class Attempt(Protocol):
    """What effects need of a running attempt (a ``JobContext`` is one); a protocol, so
    that this module does not depend on the context module that uses it."""

    @property
    def lease(self) -> Lease: ...

    def abort(self, reason: str) -> bool: ...

    def effect_key(self, name: str, key: str | None = None) -> str: ...

    def mark_completed(self) -> None: ...


class EffectDecision(enum.StrEnum):
    """A reconcile hook's verdict on an effect whose outcome is uncertain."""

    DONE = "done"  # it happened: record it done, do not call again
    REDO = "redo"  # it did not (or repeating is safe): call again, with the same key
    DEAD = "dead"  # nobody can tell: stop the job as dead for a human (UNCERTAIN_EFFECT)


class EffectNotPerformed(Exception):
    """Raise from an effect's function when the call certainly did not take effect (the
    remote refused it before acting); the record becomes ``failed`` and a later attempt
    may call again without asking anyone. Any other exception leaves the outcome uncertain."""


class UncertainEffect(Permanent):
    """The job stops as dead: an earlier attempt may have performed the effect and the
    reconcile policy could not (or would not) decide."""

    def __init__(self, record: EffectRecord, why: str) -> None:
        super().__init__(
            ErrorCode.UNCERTAIN_EFFECT,
            f"effect {record.name!r}{' key ' + repr(record.key) if record.key else ''} was "
            f"started by attempt {record.attempt} (token {record.lease_token}) and never "
            f"recorded done; {why}",
        )
        self.record = record


#: A task's reconcile hook: ``hook(ctx, record)`` with the job's ``JobContext``, returning an
#: ``EffectDecision`` (or its value), possibly awaitable in async tasks.
Reconciler = Callable[[Any, EffectRecord], Any]


# -- the protocol, once ------------------------------------------------------------------


@dataclass(frozen=True)
class _Get:
    pass


@dataclass(frozen=True)
class _Reconcile:
    record: EffectRecord


@dataclass(frozen=True)
class _Start:
    pass


@dataclass(frozen=True)
class _Call:
    pass


@dataclass(frozen=True)
class _Finish:
    status: str
    result: Any = None
    error: str | None = None
    token: int | None = None  # finish a record an earlier attempt started


_Step = _Get | _Reconcile | _Start | _Call | _Finish


def effect_flow(name: str, key: str) -> Generator[_Step, Any, Any]:
    """The effect protocol as steps; the driver sends each step's result back in."""
    record: EffectRecord | None = yield _Get()
    if record is not None and record.status == "done":
        return record.result  # an earlier attempt finished it: never call twice
    if record is not None and record.status == "started":
        decision = EffectDecision((yield _Reconcile(record)))
        if decision is EffectDecision.DONE:
            yield _Finish("done", token=record.lease_token)
            return None
        if decision is EffectDecision.DEAD:
            raise UncertainEffect(record, "stopping for a human instead of repeating it")
    if not (yield _Start()):
        raise LeaseLost(ErrorCode.LEASE_LOST, f"lease lost before effect {name!r} could start")
    try:
        result = yield _Call()
    except EffectNotPerformed as exc:
        yield _Finish("failed", error=f"{type(exc).__name__}: {exc}")
        raise
    yield _Finish("done", result=_jsonable(result))
    return result


def _jsonable(result: Any) -> Any:
    try:
        validate.encode_payload(result)
    except PayloadError:
        return None  # kept only when it can be stored; the effect is done either way
    return result


def _decision(value: Any, record: EffectRecord) -> EffectDecision:
    if value is None:
        raise UncertainEffect(record, "the task has no reconcile hook for it")
    try:
        return EffectDecision(value)
    except ValueError:
        raise UncertainEffect(record, f"its reconcile hook answered {value!r}") from None


# -- drivers -----------------------------------------------------------------------------


@dataclass
class EffectSite:
    """Everything the drivers need about one effect of one attempt."""

    ctx: Attempt
    name: str
    key: str
    reconciler: Reconciler | None


def run_effect(site: EffectSite, client: Client, fn: Callable[[str], Any]) -> Any:
    """Carry out the effect protocol from a sync handler (in its thread)."""
    flow = effect_flow(site.name, site.key)
    lease = site.ctx.lease
    send: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            step = flow.throw(thrown) if thrown is not None else flow.send(send)
        except StopIteration as stop:
            return stop.value
        send, thrown = None, None
        try:
            if isinstance(step, _Get):
                send = client.effect_get(lease.job_id, site.name, site.key)
            elif isinstance(step, _Reconcile):
                hook = site.reconciler
                send = _decision(None if hook is None else hook(site.ctx, step.record), step.record)
            elif isinstance(step, _Start):
                send = client.effect_start(lease, site.name, site.key)
                _note_lost(site, send)
            elif isinstance(step, _Call):
                send = fn(site.ctx.effect_key(site.name, site.key or None))
            else:
                send = _finish(client.effect_finish, site, step)
        except BaseException as exc:
            thrown = exc


async def run_effect_async(site: EffectSite, client: AsyncClient, fn: Callable[[str], Any]) -> Any:
    """Carry out the effect protocol from an async handler; ``fn`` and the reconcile hook
    may be sync or async."""
    flow = effect_flow(site.name, site.key)
    lease = site.ctx.lease
    send: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            step = flow.throw(thrown) if thrown is not None else flow.send(send)
        except StopIteration as stop:
            return stop.value
        send, thrown = None, None
        try:
            if isinstance(step, _Get):
                send = await client.effect_get(lease.job_id, site.name, site.key)
            elif isinstance(step, _Reconcile):
                hook = site.reconciler
                verdict = None if hook is None else await _maybe_await(hook(site.ctx, step.record))
                send = _decision(verdict, step.record)
            elif isinstance(step, _Start):
                send = await client.effect_start(lease, site.name, site.key)
                _note_lost(site, send)
            elif isinstance(step, _Call):
                send = await _maybe_await(fn(site.ctx.effect_key(site.name, site.key or None)))
            else:
                send = await _finish(client.effect_finish, site, step)
        except BaseException as exc:
            thrown = exc


def _note_lost(site: EffectSite, started: bool) -> None:
    if not started:
        site.ctx.abort(ErrorCode.LEASE_LOST)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _finish(finish: Callable[..., Any], site: EffectSite, step: _Finish) -> Any:
    lease = site.ctx.lease
    if step.token is not None and step.token != lease.token:
        lease = replace(lease, token=step.token)
    return finish(
        lease, site.name, site.key, status=step.status, result=step.result, error=step.error
    )


# -- fenced transactions -------------------------------------------------------------------


class FencedTransaction:
    """``with ctx.transaction() as conn`` (sync handlers) or ``async with`` (async ones).

    Yields a psycopg connection inside a transaction. Leaving the block without an error
    runs the job's fenced completion *in the same transaction* and commits: the handler's
    writes and the job's success are one atomic fact. If the fence refuses (the lease was
    lost), everything rolls back and :class:`LeaseLost` is raised. Use it as the handler's
    last step: the job is succeeded once the block is left.
    """

    def __init__(
        self,
        ctx: Attempt,
        sync_client: Callable[[], Client] | None,
        async_client: AsyncClient | None,
    ) -> None:
        self._ctx = ctx
        self._sync_client = sync_client
        self._async_client = async_client
        self._conn_cm: Any = None
        self._tx_cm: Any = None

    def _lost(self) -> BaseException:
        self._ctx.abort(ErrorCode.LEASE_LOST)
        return lease_lost(self._ctx.lease, "lease lost; transaction rolled back")

    def __enter__(self) -> psycopg.Connection[Any]:
        if self._sync_client is None:
            raise TypeError("use `async with ctx.transaction()` in an async handler")
        self._conn_cm = self._sync_client().connection()
        conn = self._conn_cm.__enter__()
        self._tx_cm = conn.transaction()
        self._tx_cm.__enter__()
        self._conn = conn
        return conn  # type: ignore[no-any-return]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._sync_client is not None
        error = exc
        try:
            if error is None:
                try:
                    if not self._sync_client().complete(self._ctx.lease, connection=self._conn):
                        error = self._lost()
                except BaseException as raised:  # the completion's own error, kept as is
                    error = raised
            # Rolls back when anything failed, commits otherwise.
            self._tx_cm.__exit__(*_exc_info(error))
            if error is None:
                self._ctx.mark_completed()
        except BaseException as raised:
            error = error or raised
            raise
        finally:
            # Hand the connection back knowing about the failure: told "no error", psycopg
            # would try to commit inside the transaction block and mask the real cause.
            self._conn_cm.__exit__(*_exc_info(error))
        if error is not None and error is not exc:
            raise error

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        if self._async_client is None:
            raise TypeError("use `with ctx.transaction()` in a sync handler")
        self._conn_cm = self._async_client.connection()
        conn = await self._conn_cm.__aenter__()
        self._tx_cm = conn.transaction()
        await self._tx_cm.__aenter__()
        self._aconn = conn
        return conn  # type: ignore[no-any-return]

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._async_client is not None
        error = exc
        try:
            if error is None:
                try:
                    if not await self._async_client.complete(
                        self._ctx.lease, connection=self._aconn
                    ):
                        error = self._lost()
                except BaseException as raised:  # incl. CancelledError at a lease deadline
                    error = raised
            await self._tx_cm.__aexit__(*_exc_info(error))
            if error is None:
                self._ctx.mark_completed()
        except BaseException as raised:
            error = error or raised
            raise
        finally:
            await self._conn_cm.__aexit__(*_exc_info(error))
        if error is not None and error is not exc:
            raise error


def _exc_info(
    error: BaseException | None,
) -> tuple[type[BaseException] | None, BaseException | None, TracebackType | None]:
    if error is None:
        return None, None, None
    return type(error), error, error.__traceback__
