"""Durable sleep and waits for signals (``ctx.sleep``, ``ctx.sleep_until``,
``ctx.wait_for``; docs/durable.md), built on steps.

A sleep or a wait is a step whose record holds its wake-up time, fixed the first time it
runs (on the database clock) and read back on every rerun. At the step the job's row is
locked under the lease's fence and the pure decision (``leaseq.rules.durable``) is carried
out in that transaction: go on (a sleep that is due), deliver the awaited signal into the
step's record, record the timeout, or suspend the job — its lease, limit slots and
connection given back, the attempt not charged — and raise :class:`JobSuspended`, so the
handler stops; the job runs again from the start when it wakes, its finished steps
answered from their records.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from leaseq.codes import ErrorCode
from leaseq.errors import ConfigError, Permanent
from leaseq.rules.durable import WaitDecision
from leaseq.worker.aborts import JobSuspended, aborted, lease_lost
from leaseq.worker.steps import StepSite, may_run

if TYPE_CHECKING:
    from leaseq.client import Client
    from leaseq.client_async import AsyncClient
    from leaseq.ops.steps_async import WaitOutcome


class WaitTimeout(Permanent):
    """``ctx.wait_for`` waited its whole timeout and the signal never came. Catch it to
    take the other branch (e.g. reject an approval nobody gave); uncaught, the job ends
    dead with ``WAIT_TIMEOUT`` (every rerun would time out the same way)."""

    def __init__(self, signal: str, timeout: float | None) -> None:
        super().__init__(
            ErrorCode.WAIT_TIMEOUT, f"signal {signal!r} did not come within {timeout:g}s"
        )
        self.signal = signal


def sleep_name(site: StepSite, name: str | None) -> str:
    return name if name is not None else f"sleep-{site.book.position + 1}"


def until_epoch(when: dt.datetime) -> float:
    if when.tzinfo is None:
        raise ConfigError("sleep_until needs an aware datetime (a time zone, e.g. UTC)")
    return when.timestamp()


class SuspendRefused(Permanent):
    """A job with an ordering key reached a sleep, a wait for a signal or a gather that would
    wait. Suspending it would break its key's order: while suspended, the next job of the
    key would be promoted past it (docs/durable.md). The job ends dead at once with
    ``SUSPEND_REFUSED`` (no retry could succeed): under the key's ``block`` policy the key
    then waits for an operator's replay or skip, as after any dead head."""

    def __init__(self, what: str) -> None:
        super().__init__(
            ErrorCode.SUSPEND_REFUSED,
            f"a job with an ordering key cannot {what}: a suspended job would not hold its "
            "key's order (docs/durable.md)",
        )


def check_suspendable(lease: Any, what: str = "sleep or wait") -> None:
    if lease.ordering_key is not None:
        raise SuspendRefused(what)


def _check_suspendable(site: StepSite) -> None:
    check_suspendable(site.lease)


def _begin(site: StepSite, name: str) -> tuple[int, Any]:
    _check_suspendable(site)
    may_run(site, name)  # a resumed process past its lease stops here, before any write
    seq, record = site.book.begin(name)
    site.book.active = None  # a timer step runs no function: nothing to nest in
    return seq, record


def _lost(site: StepSite, what: str) -> BaseException:
    site.abort(ErrorCode.LEASE_LOST)
    return lease_lost(site.lease, what)


def _timer(site: StepSite, recorded: tuple[bool, float | None], name: str) -> float | None:
    ok, until = recorded
    if not ok:
        raise _lost(site, f"lease lost; {name!r} not recorded")
    return until


def _outcome(
    site: StepSite, outcome: WaitOutcome, signal: str | None, timeout: float | None
) -> Any:
    decision, payload = outcome
    if decision == "lost":
        raise _lost(site, "lease lost at a durable wait")
    if decision == "cancel":
        site.abort(ErrorCode.CANCELLED)
        raise aborted(site.lease, ErrorCode.CANCELLED)
    if decision is WaitDecision.SUSPEND:
        site.suspended()
        what = f"signal {signal!r}" if signal else "its wake-up time"
        raise JobSuspended("SUSPENDED", f"job {site.lease.job_id} suspended until {what}")
    if decision is WaitDecision.TIMEOUT:
        assert signal is not None
        raise WaitTimeout(signal, timeout)
    return payload


def _wait_name(site: StepSite, signal: str) -> tuple[str, int]:
    """The step of this run's next wait for ``signal`` (``wait:<signal>``, then
    ``wait:<signal>/2``, ...) and the delivery it consumes: the one after those the earlier
    waits for that name got (deliveries are numbered in the order sent, from 1)."""
    book = site.book
    k = book.waits[signal] = book.waits.get(signal, 0) + 1
    name = f"wait:{signal}" if k == 1 else f"wait:{signal}/{k}"
    return name, book.delivered.get(signal, 0) + 1


def _delivered(site: StepSite, signal: str, payload: Any) -> Any:
    site.book.delivered[signal] = site.book.delivered.get(signal, 0) + 1
    return payload


def _answered(record: Any, signal: str | None, timeout: float | None) -> tuple[bool, Any]:
    """A wait whose record already has its outcome: (True, payload) or a WaitTimeout."""
    result = record.result if isinstance(record.result, dict) else {}
    if "payload" in result:
        return True, result["payload"]
    if result.get("timeout"):
        assert signal is not None
        raise WaitTimeout(signal, timeout)
    return False, result.get("until")


def run_sleep(
    site: StepSite, client: Client, name: str, *, seconds: float | None, until: float | None
) -> None:
    if site.book.records is None:
        site.book.load([] if site.lease.token == 1 else client.step_records(site.lease.job_id))
    seq, record = _begin(site, name)
    if record is None:
        recorded = client.timer_record(site.lease, name, seq, seconds=seconds, until=until)
        due = _timer(site, recorded, name)
    else:
        due = record.result.get("until") if isinstance(record.result, dict) else None
    _outcome(site, client.wait_point(site.lease, record=name, until=due, signal=None), None, None)


async def run_sleep_async(
    site: StepSite, client: AsyncClient, name: str, *, seconds: float | None, until: float | None
) -> None:
    if site.book.records is None:
        site.book.load(
            [] if site.lease.token == 1 else await client.step_records(site.lease.job_id)
        )
    seq, record = _begin(site, name)
    if record is None:
        recorded = await client.timer_record(site.lease, name, seq, seconds=seconds, until=until)
        due = _timer(site, recorded, name)
    else:
        due = record.result.get("until") if isinstance(record.result, dict) else None
    outcome = await client.wait_point(site.lease, record=name, until=due, signal=None)
    _outcome(site, outcome, None, None)


def run_wait(site: StepSite, client: Client, signal: str, timeout: float | None) -> Any:
    if site.book.records is None:
        site.book.load([] if site.lease.token == 1 else client.step_records(site.lease.job_id))
    name, delivery = _wait_name(site, signal)
    seq, record = _begin(site, name)
    if record is None:
        due = _timer(site, client.timer_record(site.lease, name, seq, seconds=timeout), name)
    else:
        done, value = _answered(record, signal, timeout)
        if done:
            return _delivered(site, signal, value)
        due = value
    outcome = client.wait_point(
        site.lease, record=name, until=due, signal=signal, delivery=delivery
    )
    return _delivered(site, signal, _outcome(site, outcome, signal, timeout))


async def run_wait_async(
    site: StepSite, client: AsyncClient, signal: str, timeout: float | None
) -> Any:
    if site.book.records is None:
        site.book.load(
            [] if site.lease.token == 1 else await client.step_records(site.lease.job_id)
        )
    name, delivery = _wait_name(site, signal)
    seq, record = _begin(site, name)
    if record is None:
        recorded = await client.timer_record(site.lease, name, seq, seconds=timeout)
        due = _timer(site, recorded, name)
    else:
        done, value = _answered(record, signal, timeout)
        if done:
            return _delivered(site, signal, value)
        due = value
    outcome = await client.wait_point(
        site.lease, record=name, until=due, signal=signal, delivery=delivery
    )
    return _delivered(site, signal, _outcome(site, outcome, signal, timeout))
