"""Durable execution's operations (docs/durable.md): step records (``ctx.step``, read a
job's records and write one more under the fence, in the caller's transaction when it gives
one), the suspension of a running job at a sleep or a wait (``ctx.sleep``, ``ctx.wait_for``,
leaseq.worker.waits) and the signals sent to jobs (``signal``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from psycopg import AsyncConnection

from leaseq import validate
from leaseq.errors import InvalidTransition, JobNotFound
from leaseq.models import Lease, StepRecord, SuspendedStats
from leaseq.ops.payloads_async import AsyncPayloadOps
from leaseq.rules.durable import WaitDecision, decide_wait

#: What a wait point found: the decision, or "lost" (the lease ended), or "cancel" (an
#: operator asked for the job to be cancelled), and the delivered signal's payload.
WaitOutcome = tuple[WaitDecision | str, Any]


class AsyncStepOps(AsyncPayloadOps):
    async def step_records(
        self, job_id: int, *, connection: AsyncConnection[Any] | None = None
    ) -> list[StepRecord]:
        """A job's step records in their order, results opened (on the primary: an attempt
        must see every step an earlier one committed)."""
        rows = await self._rows("step_records", {"id": job_id}, connection)
        records = [StepRecord(*row) for row in rows]
        return [dataclasses.replace(r, result=self._open(r.result, "effect")) for r in records]

    async def job_steps(self, job_id: int) -> list[StepRecord]:
        """A job's step records for inspection (results as stored: sealed ones stay so)."""
        return [StepRecord(*row) for row in await self._read("job_steps", {"id": job_id})]

    async def step_record(
        self,
        lease: Lease,
        name: str,
        seq: int,
        result: Any,
        *,
        connection: AsyncConnection[Any] | None = None,
    ) -> bool:
        """Record a finished step under the fence; False means nothing was recorded: the
        lease is lost, or a record of this name or place already committed. With
        ``connection`` the record joins that connection's transaction."""
        await self._refuse_isolation(connection)
        text = validate.encode_payload(result, self.payload_limit)
        params = {
            "id": lease.job_id,
            "owner": lease.owner,
            "token": lease.token,
            "attempt": lease.attempt,
            "name": name,
            "seq": seq,
            # Sealed as an effect record: a step is one, recorded by the worker itself.
            "result": self._seal_value(lease.task, text, "effect"),
        }
        return bool(await self._rows("step_record", params, connection))

    async def step_records_batch(
        self, records: list[tuple[Lease, str, int, str]]
    ) -> set[tuple[int, int, str]]:
        """Record finished steps of several jobs in one statement and one commit, each
        under its own lease's fence: ``records`` are (lease, name, place, JSON text of the
        result). Returns (job id, token, name) of each one recorded; a missing one was
        refused (its lease ended, or a record of its name or place already committed)."""
        params = {
            "ids": [lease.job_id for lease, _, _, _ in records],
            "owners": [lease.owner for lease, _, _, _ in records],
            "tokens": [lease.token for lease, _, _, _ in records],
            "attempts": [lease.attempt for lease, _, _, _ in records],
            "names": [name for _, name, _, _ in records],
            "seqs": [seq for _, _, seq, _ in records],
            # Sealed as an effect record: a step is one, recorded by the worker itself.
            "results": [self._seal_value(r[0].task, r[3], "effect") for r in records],
        }
        rows = await self._rows("step_records_batch", params)
        return {(int(job), int(token), str(name)) for job, token, name in rows}

    def _fence(self, lease: Lease) -> dict[str, Any]:
        return {"id": lease.job_id, "owner": lease.owner, "token": lease.token}

    async def timer_record(
        self,
        lease: Lease,
        name: str,
        seq: int,
        *,
        seconds: float | None = None,
        until: float | None = None,
    ) -> tuple[bool, float | None]:
        """Record a sleeping or waiting step with its wake-up time (``until``, epoch
        seconds, or now + ``seconds`` on the database clock; neither: no timeout), under
        the fence. (False, None) when nothing was recorded (the lease is lost)."""
        params = {
            **self._fence(lease),
            "attempt": lease.attempt,
            "name": name,
            "seq": seq,
            "seconds": seconds,
            "until": until,
        }
        rows = await self._rows("timer_record", params)
        if not rows:
            return False, None
        return True, None if rows[0][0] is None else float(rows[0][0])

    async def wait_point(
        self,
        lease: Lease,
        *,
        record: str,
        until: float | None,
        signal: str | None,
        poll: float | None = None,
        children: list[int] | None = None,
        delivery: int = 1,
    ) -> WaitOutcome:
        """At a sleep or a wait: under the job's row lock (so no signal's send can slip
        between), deliver the awaited signal into the step's record, record the timeout,
        go on (a sleep that is due), or suspend the job — in one transaction. A gather
        (``children``) also takes its gate row, so that no child's end slips between its
        look at the children ("ready": all ended) and its suspension. ``delivery``: the
        signal's delivery this wait consumes (the waits for that name before it in this
        run consumed the ones before)."""
        async with self._transaction() as conn:
            fenced = await self._rows("suspend_fence", self._fence(lease), conn)
            if not fenced:
                return "lost", None
            now, cancel = fenced[0]
            if cancel:
                return "cancel", None
            if children is not None:
                await self._rows("gather_gate", {"id": lease.job_id, "children": children}, conn)
                states = await self._rows("children_states", {"children": children}, conn)
                if not any(r[1] in ("pending", "running", "suspended") for r in states):
                    return "ready", None
            if poll is not None:  # gather: look again after ``poll`` s (database clock)
                until = float(now) + poll
            sent = []
            if signal is not None:
                wanted = {"id": lease.job_id, "name": signal, "seq": delivery}
                sent = await self._rows("signal_get", wanted, conn)
            decision = decide_wait(now=float(now), until=until, signal=signal, sent=bool(sent))
            payload = self._open(sent[0][0], "signal") if sent else None
            if decision is WaitDecision.DELIVER or decision is WaitDecision.TIMEOUT:
                outcome: dict[str, Any] = {"until": until, "signal": signal}
                if decision is WaitDecision.DELIVER:
                    outcome["payload"] = payload
                    outcome["seq"] = sent[0][1]
                else:
                    outcome["timeout"] = True
                text = validate.encode_payload(outcome, self.payload_limit)
                params = {
                    "id": lease.job_id,
                    "name": record,
                    "token": lease.token,
                    "result": self._seal_value(lease.task, text, "effect"),
                }
                await self._rows("step_result_set", params, conn)
            elif decision is WaitDecision.SUSPEND:
                params = {
                    **self._fence(lease),
                    "reason": "signal" if signal else "children" if poll else "sleep",
                    "until": until,
                    "signal": signal,
                    "detail": f"waits for signal {signal}" if signal else f"sleeps ({record})",
                }
                if not await self._rows("suspend_job", params, conn):
                    return "lost", None
        return decision, payload

    async def signal(
        self,
        job_id: int | None,
        signal: str,
        payload: Any = None,
        *,
        unique_key: str | None = None,
        actor: str | None = None,
    ) -> bool:
        """Send ``signal`` (with a JSON ``payload``) to a job, named by its id or, with
        ``job_id=None``, by the ``unique_key`` its live job holds. Each send is one
        delivery of the name (numbered 1, 2, ... in the order sent): the job's waits for
        that name take them in order, each once. True when this call stored it (and woke
        the job if it waited for it), False when the job has finished. A job that does not
        wait for it yet finds it when it does (buffered). Raises :class:`JobNotFound` for no
        such job."""
        name = validate.check_signal_name(signal)
        if job_id is None:
            if unique_key is None:
                raise JobNotFound("give a job id or a unique key")
            found = await self._rows("signal_job_by_key", {"unique_key": unique_key})
            if not found:
                raise JobNotFound(f"no live job holds unique key {unique_key!r}")
            job_id = int(found[0][0])
        async with self._transaction() as conn:
            rows = await self._rows("signal_lock", {"id": job_id}, conn)
            if not rows:
                raise JobNotFound(f"job {job_id} not found")
            status, task = rows[0]
            if status in ("succeeded", "dead", "cancelled"):
                return False
            text = self._seal_value(
                task, validate.encode_payload(payload, self.payload_limit), "signal"
            )
            params = {
                "id": job_id,
                "name": name,
                "payload": text,
                "actor": actor[:200] if actor else None,
            }
            ((stored, _woken),) = await self._rows("signal_store", params, conn)
        return bool(stored)

    async def job_signals(self, job_id: int) -> list[tuple[str, Any, Any, str | None]]:
        """The signals sent to a job: (name, payload as stored, sent_at, actor)."""
        return [(r[0], r[1], r[2], r[3]) for r in await self._read("job_signals", {"id": job_id})]

    async def suspended_stats(self) -> list[SuspendedStats]:
        """Suspended jobs by queue and reason, with the most overdue wake-up (seconds)."""
        return [SuspendedStats(*r) for r in await self._read("suspended_stats")]

    async def restart_from_step(
        self, job_id: int, step: str, *, reason: str, actor: str | None = None
    ) -> list[str]:
        """Re-run a dead or cancelled job from its step ``step``: that step's record and
        those after it are deleted, the ones before it kept, and the job is replayed
        (audited: the ``replayed`` event names the step, the actor and the reason), all in
        one transaction; a replay refused for a held unique key undoes the whole. Returns
        the names of the records deleted. Signals are kept: a wait re-run after the cut
        finds its signal already sent."""
        name = validate.check_name("step", step)
        async with self._transaction() as conn:
            rows = await self._rows("restart_lock", {"id": job_id, "name": name}, conn)
            if not rows:
                raise JobNotFound(f"job {job_id} not found")
            status, seq = rows[0]
            if seq is None:
                raise InvalidTransition(f"job {job_id} has no recorded step {name!r}")
            if status not in ("dead", "cancelled"):
                raise InvalidTransition(
                    f"job {job_id} is {status}: only a dead or cancelled job is restarted"
                )
            cut = await self._rows("steps_delete_from", {"id": job_id, "seq": seq}, conn)
            why = f"restart from step {name!r} ({len(cut)} record(s) dropped): {reason}"
            if not await self.replay(  # type: ignore[attr-defined]
                job_id, reason=why, actor=actor, allow_cancelled=True, connection=conn
            ):
                raise InvalidTransition(f"job {job_id} could not be replayed")
        return [str(r[0]) for r in cut]

    async def children_record(
        self, parent_id: int, step: str, children: list[int], connection: AsyncConnection[Any]
    ) -> None:
        """The children a spawning step enqueued, in that step's transaction."""
        params = {"id": parent_id, "step": step, "children": children}
        await self._rows("children_record", params, connection)

    async def children_states(self, children: list[int]) -> list[str | None]:
        """Each child's status now (None: no such job), in the order given (primary)."""
        rows = await self._rows("children_states", {"children": children})
        return [None if r[1] is None else str(r[1]) for r in rows]
