"""Durable steps (``ctx.step``): a named piece of a handler that runs once per job across
attempts, crashes and replays, its JSON result recorded by a fenced write and answered from
the record on every later attempt (docs/durable.md).

- :class:`StepBook` (pure, one per attempt): the records an earlier attempt committed, the
  names this run used, the place of the next step. It decides whether a step is answered
  from its record, run, or refused (a name used twice, steps out of their recorded order).
- :func:`run_step` / :func:`run_step_async`: the drivers. The record is written by
  ``step_record``, fenced by the lease and holding the job row until the commit, so a worker
  whose lease ended records nothing, and no sweep or claim ends the lease in between.
- :class:`StepTransaction`: ``ctx.transaction()`` inside a step. Its block's writes stay
  uncommitted until the step's function returns; then the record is written on the same
  connection and both commit together (exactly once for in-database work), or roll back.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from leaseq import validate
from leaseq.codes import ErrorCode
from leaseq.errors import ConfigError, PayloadError, Permanent
from leaseq.models import Lease, StepRecord
from leaseq.worker.aborts import aborted, lease_lost
from leaseq.worker.recorder import StepRecorder

if TYPE_CHECKING:
    from leaseq.client import Client
    from leaseq.client_async import AsyncClient


class StepError(Permanent):
    """A step used wrongly (a name twice in one run, a step inside a step) or out of the
    order an earlier attempt recorded: the job ends dead with the code, for a human (the
    code changed under an in-flight job: branch with ``ctx.patched``)."""


@dataclass
class ActiveStep:
    """The step whose function is running, and the transaction it opened, if any."""

    name: str
    seq: int
    held: Any = None  # (connection context, transaction context, connection)


@dataclass
class StepBook:
    """One attempt's view of its job's steps. ``records`` is None until first needed."""

    records: dict[str, StepRecord] | None = None
    by_seq: dict[int, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    position: int = 0
    active: ActiveStep | None = None
    #: Per signal name, the waits for it in this run so far, and those that got a delivery
    #: (the next wait consumes the delivery after them: ``ctx.wait_for`` twice for a name).
    waits: dict[str, int] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)

    def load(self, records: list[StepRecord]) -> None:
        """The records an earlier attempt committed. The drivers skip the read under a
        job's first lease (token 1): no lease before it could have recorded a step."""
        self.records = {r.name: r for r in records}
        self.by_seq = {r.seq: r.name for r in records}

    def failed(self, active: ActiveStep) -> None:
        """The step's function raised: nothing was recorded, so the handler may call the
        step again under its name (a retry loop inside the handler)."""
        self.active = None
        self.used.discard(active.name)
        self.position = active.seq

    def begin(self, name: str) -> tuple[int, StepRecord | None]:
        """The place of step ``name`` in this run and its record (None: run it). Raises
        :class:`StepError` for a misuse or a step out of its recorded order."""
        assert self.records is not None, "load the records first"
        if self.active is not None:
            raise StepError(
                ErrorCode.STEP_NAME_REUSED,
                f"step {name!r} called inside step {self.active.name!r}: steps do not nest",
            )
        if name in self.used:
            raise StepError(
                ErrorCode.STEP_NAME_REUSED,
                f"step {name!r} called twice in one run: give each step its own name",
            )
        self.used.add(name)
        seq, self.position = self.position, self.position + 1
        record = self.records.get(name)
        if record is not None and record.seq != seq:
            raise StepError(
                ErrorCode.STEP_OUT_OF_ORDER,
                f"step {name!r} was recorded as step {record.seq + 1} and is now called as "
                f"step {seq + 1}",
            )
        other = self.by_seq.get(seq)
        if record is None and other is not None:
            raise StepError(
                ErrorCode.STEP_OUT_OF_ORDER,
                f"step {seq + 1} was recorded as {other!r} and is now called {name!r}",
            )
        if record is None:
            self.active = ActiveStep(name, seq)
        return seq, record

    def patch(self, name: str) -> tuple[int, bool | None]:
        """Where patch marker ``name`` stands (``ctx.patched``): (seq, True) when an
        earlier run recorded it here; (seq, None) when it is to be recorded here (a job
        that has not reached this place yet: the new code); (-1, False) when an earlier run
        recorded another step at this place (it ran the code from before the patch: the
        old branch, and the marker takes no place)."""
        assert self.records is not None, "load the records first"
        marker = f"patch:{name}"
        record = self.records.get(marker)
        if record is None and self.position in self.by_seq:
            return -1, False
        seq, found = self.begin(marker)
        self.active = None  # a marker runs no function
        return seq, True if found is not None else None


def check_step_name(name: object) -> str:
    return validate.check_name("step", name)


def _encoded(name: str, value: Any, limit: int) -> tuple[str, Any]:
    """The step's value as JSON text and as its record gives it back (JSON round trip: the
    first run and every later one see the same value)."""
    try:
        text = validate.encode_payload(value, limit)
        return text, json.loads(text)
    except PayloadError as exc:
        raise StepError(
            ErrorCode.STEP_RESULT_INVALID, f"step {name!r} returned what cannot be recorded: {exc}"
        ) from None


@dataclass
class StepSite:
    """What the drivers need about one attempt (a ``JobContext`` gives it): ``aborted``
    is why the worker gave up on it (or None), ``deadline`` the lease's local deadline
    (``time.monotonic()``; None outside a worker)."""

    lease: Lease
    book: StepBook
    abort: Callable[[str], bool]
    aborted: str | None
    deadline: float | None
    suspended: Callable[[], None] = lambda: None  # the job was suspended (a durable wait)
    #: The worker's group commit of records (None outside a worker): a step without a
    #: transaction of its own has its record written with other jobs' records.
    recorder: StepRecorder | None = None


def may_run(site: StepSite, name: str) -> None:
    """A step's function never starts under a lease that surely ended: then another worker
    may own the job and may have recorded this very step already (a paused process
    resumed past its lease learns it here, before it acts)."""
    if site.aborted is not None:
        raise aborted(site.lease, site.aborted)
    if site.deadline is not None and time.monotonic() >= site.deadline:
        raise _lost(site, name, "lease ended before step {name!r} could start; not run")


def _lost(
    site: StepSite, name: str, what: str = "lease lost; step {name!r} not recorded"
) -> BaseException:
    site.abort(ErrorCode.LEASE_LOST)
    return lease_lost(site.lease, what.format(name=name))


def run_step(site: StepSite, client: Client, name: str, fn: Callable[..., Any], args: Any) -> Any:
    """Carry out one step from a sync handler (in its thread)."""
    book = site.book
    if book.records is None:
        book.load([] if site.lease.token == 1 else client.step_records(site.lease.job_id))
    seq, record = book.begin(name)
    if record is not None:
        return record.result
    active = book.active
    assert active is not None
    try:
        may_run(site, name)
        text, value = _encoded(name, fn(*args), client.payload_limit)
    except BaseException as exc:
        book.failed(active)
        _release(active, exc)  # rolls back the step's transaction
        raise
    book.active = None
    error: BaseException | None = None
    try:
        if active.held is None and site.recorder is not None:
            recorded = site.recorder.record_from_thread(site.lease, name, seq, text)
        else:
            conn = active.held[2] if active.held else None
            recorded = client.step_record(site.lease, name, seq, value, connection=conn)
        if not recorded:
            error = _lost(site, name)
    except BaseException as exc:
        error = exc
    _release(active, error)
    if error is not None:
        raise error
    return value


async def run_step_async(
    site: StepSite, client: AsyncClient, name: str, fn: Callable[..., Any], args: Any
) -> Any:
    """Carry out one step from an async handler; ``fn`` may be sync or async."""
    book = site.book
    if book.records is None:
        book.load([] if site.lease.token == 1 else await client.step_records(site.lease.job_id))
    seq, record = book.begin(name)
    if record is not None:
        return record.result
    active = book.active
    assert active is not None
    try:
        may_run(site, name)
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
        text, value = _encoded(name, value, client.payload_limit)
    except BaseException as exc:
        book.failed(active)
        await _release_async(active, exc)
        raise
    book.active = None
    error: BaseException | None = None
    try:
        if active.held is None and site.recorder is not None:
            recorded = await site.recorder.record(site.lease, name, seq, text)
        else:
            conn = active.held[2] if active.held else None
            recorded = await client.step_record(site.lease, name, seq, value, connection=conn)
        if not recorded:
            error = _lost(site, name)
    except BaseException as exc:
        error = exc
    await _release_async(active, error)
    if error is not None:
        raise error
    return value


# -- the step's transaction ----------------------------------------------------------------


def _exc_info(
    error: BaseException | None,
) -> tuple[type[BaseException] | None, BaseException | None, TracebackType | None]:
    if error is None:
        return None, None, None
    return type(error), error, error.__traceback__


def _release(active: ActiveStep, error: BaseException | None) -> None:
    """End a step's held transaction: commit when ``error`` is None and the step finished
    (the record is in it), else roll back; then hand the connection back."""
    if not active.held:
        return
    conn_cm, tx_cm, _conn = active.held
    active.held = None
    try:
        tx_cm.__exit__(*_exc_info(error))
    finally:
        conn_cm.__exit__(*_exc_info(error))


async def _release_async(active: ActiveStep, error: BaseException | None) -> None:
    if not active.held:
        return
    conn_cm, tx_cm, _conn = active.held
    active.held = None
    try:
        await tx_cm.__aexit__(*_exc_info(error))
    finally:
        await conn_cm.__aexit__(*_exc_info(error))


class StepTransaction:
    """``ctx.transaction()`` inside a step: ``with`` (sync) or ``async with`` (async). The
    block's writes commit with the step's record when the step's function returns, or
    roll back with it (an error in or after the block, a lost lease). One per step."""

    def __init__(
        self,
        active: ActiveStep,
        sync_client: Callable[[], Client] | None,
        async_client: AsyncClient | None,
    ) -> None:
        if active.held is not None:
            raise ConfigError(f"step {active.name!r} already opened its transaction")
        self._active = active
        self._sync_client = sync_client
        self._async_client = async_client
        self._cms: Any = None

    def __enter__(self) -> Any:
        if self._sync_client is None:
            raise TypeError("use `async with ctx.transaction()` in an async handler")
        conn_cm = self._sync_client().connection()
        conn = conn_cm.__enter__()
        tx_cm = conn.transaction()
        try:
            tx_cm.__enter__()
        except BaseException as exc:
            conn_cm.__exit__(*_exc_info(exc))
            raise
        self._cms = (conn_cm, tx_cm, conn)
        return conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self._active.held = self._cms  # committed with the record, by run_step
            return
        conn_cm, tx_cm, _conn = self._cms
        try:
            tx_cm.__exit__(exc_type, exc, tb)
        finally:
            conn_cm.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Any:
        if self._async_client is None:
            raise TypeError("use `with ctx.transaction()` in a sync handler")
        conn_cm = self._async_client.connection()
        conn = await conn_cm.__aenter__()
        tx_cm = conn.transaction()
        try:
            await tx_cm.__aenter__()
        except BaseException as exc:
            await conn_cm.__aexit__(*_exc_info(exc))
            raise
        self._cms = (conn_cm, tx_cm, conn)
        return conn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self._active.held = self._cms
            return
        conn_cm, tx_cm, _conn = self._cms
        try:
            await tx_cm.__aexit__(exc_type, exc, tb)
        finally:
            await conn_cm.__aexit__(exc_type, exc, tb)


def run_patched(site: StepSite, client: Client, name: str) -> bool:
    """``ctx.patched`` from a sync handler."""
    if site.book.records is None:
        site.book.load([] if site.lease.token == 1 else client.step_records(site.lease.job_id))
    seq, known = site.book.patch(name)
    if known is None and not client.step_record(site.lease, f"patch:{name}", seq, True):
        raise _lost(site, f"patch:{name}")
    return bool(known is None or known)


async def run_patched_async(site: StepSite, client: AsyncClient, name: str) -> bool:
    """``ctx.patched`` from an async handler."""
    if site.book.records is None:
        site.book.load(
            [] if site.lease.token == 1 else await client.step_records(site.lease.job_id)
        )
    seq, known = site.book.patch(name)
    if known is None and not await client.step_record(site.lease, f"patch:{name}", seq, True):
        raise _lost(site, f"patch:{name}")
    return bool(known is None or known)
