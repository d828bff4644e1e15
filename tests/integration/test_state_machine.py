"""A hypothesis state machine against a real schema: random interleavings of enqueue, claim,
complete, fail, heartbeat, release, lease expiry, sweep, cancel, replay, skip, purge, prune,
pause and resume, a queue concurrency limit set, lowered and removed, a task limit's slot
rows, batches with callbacks and stored results, by several virtual workers, with the
invariants of DESIGN.md section 3 (the per-key order of README "Ordering and fairness", no
claim of a paused scope, slots held = the running leases claimed under a limit (each its
job's cost in units: jobs of cost 2 and 3 among the others), at most one
live job per unique key, a dependent promoted only after its dependencies, each batch's
callback once and of the right kind, a stored result only from the final lease) checked
after every step.

Every stored event of every job is also checked against ``leaseq.states.TRANSITIONS``: each
(event, from, to) must be in the table, and consecutive events must connect through the
transitions that write no event (claim, heartbeat, completion).

The test keeps a model of every job (status, fencing token, attempts, cancel request, lease
holder, audit trail) and predicts each call's result exactly: a fenced write with a stale or
expired lease must return False and leave the jobs table and the trail as they were. Time
only moves in the database (leases expired and back-off skipped with SQL), never by sleeping.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine as hypothesis_engine
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

import leaseq
from leaseq.owners import worker_of
from leaseq.states import TRANSITIONS, UNRECORDED_EVENTS, JobStatus, allowed

WORKERS = ("w0", "w1", "w2")
LEASE_SECONDS = 600.0  # never runs out by itself during a run: only the test expires leases
MAX_UNFINISHED = 6  # enough jobs to interleave; more would only dilute the other rules
#: The largest cost enqueue_costly draws (issue 32: a job takes its cost in units of each limit).
MAX_COST = 3
UNKNOWN_ATTEMPTS = 3  # RetryPolicy's default budget for failures of unknown cause
TERMINAL = frozenset({"succeeded", "dead", "cancelled"})
FAIL_MODES = ("transient", "permanent", "unknown")
ACTIONS = ("complete", *(f"fail:{m}" for m in FAIL_MODES), "heartbeat", "release")

# What enqueue may ask for: most jobs unkeyed, some sharing one of two ordering keys, and
# some with one of two unique keys (a window after success, or none; skip, replace or raise).
job_specs = st.tuples(
    st.integers(1, 4),  # max_attempts
    st.sampled_from([None, None, "k1", "k2"]),  # ordering_key
    st.sampled_from(["block", "skip"]),  # key_policy
    st.sampled_from([None, None, "u1", "u2"]),  # unique_key
    st.booleans(),  # unique_for: a window after success
    st.sampled_from(["skip", "replace", "raise"]),  # on_conflict
)
JobSpecT = tuple[int, str | None, str, str | None, bool, str]

# (event, from_status, to_status, lease_token, attempt) as stored in job_events.
Event = tuple[str, str | None, str | None, int | None, int | None]

# Keyed jobs get their own task name, so a purge can be limited to jobs without a key.
UNKEYED_TASK, KEYED_TASK = "sm.task", "sm.keyed"
# Batch callbacks run on a queue of their own, outside the model (they are checked by
# batches_fire_once): the rules claim, count and compare only the default queue.
CALLBACK_TASK, CALLBACK_QUEUE = "sm.callback", "sm_callbacks"
# A task limit no claim reaches (so the claim's prediction stays exact) that still makes the
# claims of UNKEYED_TASK take slot rows while it exists.
TASK_LIMIT = "task:" + UNKEYED_TASK
# What pause/resume may name: the one queue every job is in, or one of the two tasks.
PAUSE_SCOPES = (("queue", "default"), ("task", UNKEYED_TASK), ("task", KEYED_TASK))


def _unrecorded_reach(status: str | None) -> set[str | None]:
    """Statuses a job can reach from ``status`` without writing an event (claim, heartbeat,
    completion), ``status`` included."""
    reach: set[str | None] = {status}
    frontier = [status]
    while frontier:
        here = frontier.pop()
        for move in TRANSITIONS:
            to = None if move.to_status is None else str(move.to_status)
            src = None if move.from_status is None else str(move.from_status)
            if move.event in UNRECORDED_EVENTS and src == here and to not in reach:
                reach.add(to)
                frontier.append(to)
    return reach


@dataclass
class JobModel:
    """What the test believes one job row holds."""

    max_attempts: int
    key: str | None = None
    key_policy: str = "block"
    key_skipped: bool = False
    status: str = "pending"
    token: int = 0
    attempts: int = 0
    unknown_failures: int = 0
    owner: str | None = None
    expired: bool = False  # the current lease's expiry was moved into the past
    cancel_requested: bool = False
    replayed: bool = False
    started: int | None = None  # logical time of the first claim since enqueue or replay
    replayed_at: int | None = None  # logical time of the last replay
    completions: int = 0  # successful complete() calls
    last_error_code: str | None = None
    last_error_class: str | None = None
    events: list[Event] = field(default_factory=list)
    unique_key: str | None = None
    window: bool = False  # unique_for given: the key stays held after success
    deps: dict[int, str] = field(default_factory=dict)  # dependency id -> on_dead
    waiting: bool = False
    promoted_at: int | None = None  # logical time it stopped waiting
    cost: int = 1  # units of each concurrency limit it takes while it runs

    @property
    def live(self) -> bool:
        return self.status == "running" and not self.expired

    @property
    def key_finished(self) -> bool:
        """Finished as far as its key's order goes: succeeded, cancelled, dead-and-skipped."""
        return self.status in ("succeeded", "cancelled") or (
            self.status == "dead" and (self.key_policy == "skip" or self.key_skipped)
        )


def _failure_outcome(job: JobModel, mode: str, cancel: bool = True) -> str:
    """Where a failed attempt (an expired lease counts as transient) leads, as leaseq decides
    (``cancel``: counting a pending cancel request)."""
    if (
        mode == "permanent"
        or job.attempts >= job.max_attempts
        or (mode == "unknown" and job.unknown_failures + 1 >= UNKNOWN_ATTEMPTS)
    ):
        to = "dead"
    else:
        to = "pending"
    # A pending cancel request turns any failure into cancelled (README, "States").
    return "cancelled" if job.cancel_requested and cancel else to


def _key(lease: leaseq.Lease) -> str:
    return f"(job={lease.job_id}, token={lease.token}, owner={lease.owner})"


class LeaseqMachine(RuleBasedStateMachine):
    dsn: ClassVar[str] = ""

    jobs = Bundle("jobs")
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.schema = f"t_sm_{uuid.uuid4().hex[:12]}"
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.client = leaseq.Client(
            self.dsn,
            schema=self.schema,
            pool_size=1,
            retry_policy=leaseq.RetryPolicy(base=0.001, cap=0.01),
        )
        self.client.migrate()
        self.model: dict[int, JobModel] = {}
        self.purged: dict[int, JobModel] = {}  # gone from the table, their trail kept
        self.issued: dict[tuple[int, int], leaseq.Lease] = {}
        self.seen_tokens: dict[int, int] = {}
        self.owners_seen: set[str] = set()  # every claim's owner is its own
        self.clock = 0  # logical time: one tick per claim or replay
        self.paused: set[tuple[str, str]] = set()
        #: Who holds each unique key: (job id, only a window after it succeeded).
        self.holders: dict[str, tuple[int, bool]] = {}
        #: The concurrency limit on the queue (None: none), the highest ever set, and the
        #: leases (job, token) claimed while one was in force: each holds one slot while
        #: its job runs under that token.
        self.queue_limit: int | None = None
        self.limit_cap = 0
        self.slotted: set[tuple[int, int]] = set()
        self.task_slotted: set[tuple[int, int]] = set()
        #: A task limit on UNKEYED_TASK is in force (its slot rows are in held_slots too).
        self.task_limit = False
        #: A job of cost above 1 was enqueued: from then on the queue limit is at least
        #: MAX_COST (a cost above it would end the job dead at its claim, outside the model).
        self.costly = False
        #: Batches: their members, and the callback each fired (kind), once fired.
        self.batches: dict[int, list[int]] = {}
        self.fired: dict[int, str] = {}
        #: Stored results: job id -> the token of the lease that completed it.
        self.results: dict[int, int] = {}

    def teardown(self) -> None:
        self.client.close()
        self.conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
        )
        self.conn.close()

    # -- database access -------------------------------------------------------------------

    def _query(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        q = sql.SQL(query).format(s=sql.Identifier(self.schema))
        return self.conn.execute(q, params or None).fetchall()

    def _snapshot(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Every job row and the shape of the trail: a refused call must change neither."""
        return (
            self._query("SELECT * FROM {s}.jobs ORDER BY id"),
            self._query("SELECT count(*), max(id) FROM {s}.job_events")
            + self._query("SELECT limit_name, slot, job_id, lease_token FROM {s}.held_slots"),
        )

    def _refused(self, call: Callable[[], Any], what: str) -> None:
        before = self._snapshot()
        result = call()
        assert result is False, f"{what} should have been refused, returned {result!r}"
        assert self._snapshot() == before, f"refused {what} changed the database"

    def _lease_is_current(self, lease: leaseq.Lease) -> bool:
        job = self.model.get(lease.job_id)
        return job is not None and job.live and (job.token, job.owner) == (lease.token, lease.owner)

    def _unfinished(self) -> int:
        return sum(1 for j in self.model.values() if j.status in ("pending", "running"))

    def _ids(self, pred: Callable[[JobModel], bool]) -> list[int]:
        return sorted(job_id for job_id, job in self.model.items() if pred(job))

    # -- enqueue -----------------------------------------------------------------------------

    @precondition(lambda self: self._unfinished() < MAX_UNFINISHED)
    @rule(target=jobs, specs=st.lists(job_specs, min_size=1, max_size=3))
    def enqueue(self, specs: list[JobSpecT]) -> Any:
        """One job with enqueue(), several with enqueue_many(); a unique key already held
        resolves as its on_conflict says (one by one, in input order, for a batch)."""
        raising = [s for s in specs if s[3] is not None and s[5] == "raise"]
        if raising and len(specs) > 1:
            specs = [s for s in specs if s not in raising] or specs[:1]
        items = [
            dict(
                task=KEYED_TASK if k else UNKEYED_TASK,
                payload=i,
                max_attempts=m,
                ordering_key=k,
                key_policy=p,
                unique_key=u,
                unique_for=3600 if (u and w) else None,
                on_conflict=c if u else None,
            )
            for i, (m, k, p, u, w, c) in enumerate(specs)
        ]
        if len(specs) == 1:
            if self._expect_enqueue(specs[0]) == "raise":
                before = self._snapshot()
                with pytest.raises(leaseq.UniqueConflict):
                    self.client.enqueue(**items[0])
                assert self._snapshot() == before, "a refused enqueue changed the database"
                return multiple()
            ids = [self.client.enqueue(**items[0])]
        else:
            ids = self.client.enqueue_many(items)
        assert len(ids) == len(specs)
        new = []
        for result, spec in zip(ids, specs, strict=True):
            # One by one: a later item of a batch meets the holders the earlier ones left.
            new += self._apply_enqueue(result, spec, self._expect_enqueue(spec))
        assert new == sorted(new) and len(new) == len(set(new))
        return multiple(*new)

    @precondition(lambda self: bool(self.holders) and self._unfinished() < MAX_UNFINISHED)
    @rule(
        target=jobs,
        data=st.data(),
        on_conflict=st.sampled_from(["skip", "replace", "raise"]),
        batch=st.booleans(),
    )
    def enqueue_onto_a_held_key(self, data: st.DataObject, on_conflict: str, batch: bool) -> Any:
        """A unique key some job holds (live or its window) is enqueued again: the conflicts
        random keys would reach only rarely (a follow-up needs a running holder)."""
        key = data.draw(st.sampled_from(sorted(self.holders)), label="unique_key")
        spec: JobSpecT = (2, None, "block", key, False, on_conflict)
        if batch and on_conflict != "raise":
            return self.enqueue([spec, (2, None, "block", None, False, "skip"), spec])
        return self.enqueue([spec])

    def _live_holders(self) -> list[int]:
        return sorted(
            job_id
            for job_id, window in self.holders.values()
            if not window and self.model[job_id].live
        )

    @precondition(lambda self: bool(self._live_holders()) and self._unfinished() < MAX_UNFINISHED)
    @rule(target=jobs, data=st.data())
    def replace_a_leased_holder_then_release(self, data: st.DataObject) -> Any:
        """A deploy: a replace queues a follow-up behind a leased (prefetched) holder, then
        the worker shuts down and releases the holder's lease (issue 28, item 1)."""
        job_id = data.draw(st.sampled_from(self._live_holders()), label="holder")
        key = self.model[job_id].unique_key
        new = self.enqueue([(2, None, "block", key, False, "replace")])
        self._act(self.issued[(job_id, self.model[job_id].token)], "release")
        return new

    @precondition(lambda self: bool(self.model) and self._unfinished() < MAX_UNFINISHED)
    @rule(
        target=jobs,
        parents=st.lists(jobs, min_size=1, max_size=3, unique=True),
        on_dead=st.sampled_from(["cancel", "run", "ignore"]),
        max_attempts=st.integers(1, 3),
    )
    def enqueue_dependent(self, parents: list[int], on_dead: str, max_attempts: int) -> Any:
        """A job depending on jobs of any state (one pruned or purged is refused, nothing
        stored); it waits, or is decided at once when they have all ended."""
        item = dict(
            task=UNKEYED_TASK, max_attempts=max_attempts, depends_on=parents, on_dead=on_dead
        )
        if any(p not in self.model for p in parents):
            before = self._snapshot()
            with pytest.raises(leaseq.ConfigError, match="do not exist"):
                self.client.enqueue(**item)
            assert self._snapshot() == before, "a refused enqueue changed the database"
            return multiple()
        job_id = int(self.client.enqueue(**item))
        assert job_id not in self.model and job_id not in self.seen_tokens
        self.model[job_id] = JobModel(
            max_attempts=max_attempts, deps=dict.fromkeys(parents, on_dead), waiting=True
        )
        self._settle()
        return multiple(job_id)

    def _expect_enqueue(self, spec: JobSpecT) -> str:
        """What an enqueue of ``spec`` will do (insert, skip, replace, follow_up, raise),
        given the holders the model knows; the model is updated by _apply_enqueue."""
        key, on_conflict = spec[3], spec[5]
        if key is None or key not in self.holders:
            return "insert"
        holder, window = self.holders[key]
        if on_conflict == "raise":
            return "raise"
        if on_conflict == "skip" or window:
            return "skip"
        return "replace" if self.model[holder].status == "pending" else "follow_up"

    def _apply_enqueue(self, result: Any, spec: JobSpecT, outcome: str) -> list[int]:
        max_attempts, key, policy, ukey, window, _ = spec
        if outcome in ("skip", "replace"):
            # A later item of the same batch may meet a holder an earlier item created.
            holder, _ = self.holders[ukey]  # type: ignore[index]
            assert int(result) == holder and not result.inserted, (outcome, result)
            assert result.replaced == (outcome == "replace")
            if outcome == "replace":
                job = self.model[holder]
                job.events.append(
                    ("unique_replaced", "pending", "pending", job.token, job.attempts)
                )
            return []
        job_id = int(result)
        assert result.inserted and job_id not in self.model and job_id not in self.seen_tokens
        self.model[job_id] = JobModel(
            max_attempts=max_attempts, key=key, key_policy=policy, unique_key=ukey, window=window
        )
        if outcome == "follow_up":
            assert result.outcome == "follow_up"
            holder = self.model[self.holders[ukey][0]]  # type: ignore[index]
            holder.events.append(
                ("superseded", "running", "running", holder.token, holder.attempts)
            )
        if ukey is not None:
            self.holders[ukey] = (job_id, False)
        return [job_id]

    def _superseded(self, job_id: int) -> bool:
        job = self.model[job_id]
        return job.unique_key is not None and self.holders.get(job.unique_key) != (job_id, False)

    def _finish_key(self, job_id: int, status: str) -> None:
        """A job ended: its key becomes a window (success with unique_for) or is let go."""
        job = self.model[job_id]
        if job.unique_key is None or self.holders.get(job.unique_key) != (job_id, False):
            return
        if status == "succeeded" and job.window:
            self.holders[job.unique_key] = (job_id, True)
        else:
            del self.holders[job.unique_key]

    # -- claim -------------------------------------------------------------------------------

    @precondition(
        lambda self: (
            self._unfinished() < MAX_UNFINISHED
            and (self.queue_limit is None or self.queue_limit >= MAX_COST)
        )
    )
    @rule(target=jobs, cost=st.integers(2, MAX_COST), max_attempts=st.integers(1, 3))
    def enqueue_costly(self, cost: int, max_attempts: int) -> Any:
        """A job of cost 2 or 3: it takes that many units of each limit over it (issue 32);
        the first one claimed under the queue limit moves its slots to slot rows."""
        job_id = int(self.client.enqueue(UNKEYED_TASK, None, max_attempts=max_attempts, cost=cost))
        assert job_id not in self.model and job_id not in self.seen_tokens
        self.model[job_id] = JobModel(max_attempts=max_attempts, cost=cost)
        self.costly = True
        return multiple(job_id)

    @rule(target=leases, worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def claim(self, worker: str, limit: int) -> Any:
        claimable = {
            job_id: due and not self._paused(task)
            for job_id, due, task in self._query(
                "SELECT id, available_at <= now(), task FROM {s}.jobs "
                "WHERE status = 'pending' AND NOT blocked AND NOT waiting"
                " AND queue_name = 'default'"
            )
        }
        ready = sum(claimable.values())
        # Costs matter only under the queue limit (the task limit, 1000, is never reached).
        costs = self.queue_limit is not None and any(
            self.model[job_id].cost > 1 for job_id in claimable
        )
        free = limit
        if self.queue_limit is not None:
            # Slots 1..limit not held; none at all while a slot above a lowered limit is.
            ((held, above),) = self._query(
                "SELECT count(*), count(*) FILTER (WHERE slot > %s) FROM {s}.held_slots"
                " WHERE limit_name = 'queue:default'",
                self.queue_limit,
            )
            free = 0 if above else self.queue_limit - held
        got = self.client.claim(worker=worker, lease_seconds=LEASE_SECONDS, limit=limit)
        # A queue limit whose slots moved to slot rows (a costly job was claimed under it):
        # every lease under it takes slot rows.
        moved = self.queue_limit is not None and bool(
            self._query("SELECT queue_slot_rows FROM {s}.limits WHERE name = 'queue:default'")[0][0]
        )
        slot_rows = (self.task_limit and any(x.task == UNKEYED_TASK for x in got)) or (
            moved and bool(got)
        )
        if costs:
            # In units: never more than are free; the first job in claim order fits whenever
            # MAX_COST units are free, so a claim then takes at least one.
            units = sum(self.model[x.job_id].cost for x in got if x.job_id in self.model)
            assert units <= free and len(got) <= limit, (free, got)
            assert len(got) >= 1 or not ready or free < MAX_COST, (ready, free)
        else:
            # Everything ready before the call is still ready during it; back-offs may end
            # meanwhile.
            assert min(limit, ready, free) <= len(got) <= min(limit, free), (ready, free, got)
        assert len({lease.job_id for lease in got}) == len(got)
        # One owner per claim, never one an earlier claim had (a lost claim's re-issue
        # must not share its fence).
        owners = {lease.owner for lease in got}
        assert len(owners) <= 1 and not owners & self.owners_seen, owners
        self.owners_seen |= owners
        self.clock += 1
        for lease in got:
            assert lease.job_id in claimable, f"claimed job {lease.job_id}, blocked or not pending"
            assert not self._paused(lease.task), f"claimed job {lease.job_id} of a paused scope"
            job = self.model[lease.job_id]
            where = f"claim of job {lease.job_id}"
            assert job.status == "pending", f"{where}, which was {job.status}"
            assert lease.token == job.token + 1, f"{where}: token must grow by exactly one"
            assert worker_of(lease.owner) == worker, f"{where}: owner {lease.owner}"
            assert lease.attempt == job.attempts + 1 <= job.max_attempts, where
            assert lease.max_attempts == job.max_attempts
            assert lease.unknown_failures == job.unknown_failures
            assert lease.ordering_key == job.key
            assert lease.unique_key == job.unique_key
            if job.key is not None:
                self._check_key_order(lease.job_id, job)
            self._check_dependencies_ended(lease.job_id, job)
            job.status, job.token, job.owner = "running", lease.token, lease.owner
            if job.started is None:
                job.started = self.clock
            job.attempts += 1
            job.expired = False
            self.issued[(lease.job_id, lease.token)] = lease
            assert lease.limited == (self.queue_limit is not None or self.task_limit), where
            if self.queue_limit is not None:
                self.slotted.add((lease.job_id, lease.token))
            # The task limit's slot row: reported by admit() (Lease.slot_rows), so the
            # lease's end deletes it (issue 28, item 5).
            under_task_limit = self.task_limit and lease.task == UNKEYED_TASK
            assert lease.slot_rows == slot_rows, where
            if under_task_limit:
                self.task_slotted.add((lease.job_id, lease.token))
        return multiple(*got)

    def _check_dependencies_ended(self, job_id: int, job: JobModel) -> None:
        """No job runs while a dependency is unfinished, unless that dependency was replayed
        after this job had been promoted (a promotion is final)."""
        for dep in job.deps:
            parent = self.model.get(dep)
            if parent is None or parent.status in TERMINAL:
                continue
            late = parent.replayed_at is not None and parent.replayed_at > (job.promoted_at or 0)
            assert late, f"claim of job {job_id} while its dependency {dep} is {parent.status}"

    def _dep_state(self, job: JobModel) -> str:
        """wait, run or cancel, as promote_dependents decides (a gone job has ended)."""
        ended = [self.model.get(d) for d in job.deps]
        if any(
            p is not None and p.status in ("dead", "cancelled") and job.deps[d] == "cancel"
            for d, p in zip(job.deps, ended, strict=True)
        ):
            return "cancel"
        return "run" if all(p is None or p.status in TERMINAL for p in ended) else "wait"

    def _settle(self) -> None:
        """What the transitions just made promote: every waiting job whose dependencies all
        ended is promoted, one whose "cancel" dependency failed ends cancelled (and that
        is an ending too, so this repeats down the graph)."""
        changed = True
        while changed:
            changed = False
            for job in self.model.values():
                if not job.waiting:
                    continue
                state = self._dep_state(job)
                if state == "wait":
                    continue
                changed = True
                job.waiting = False
                if state == "run":
                    job.events.append(("promoted", "pending", "pending", job.token, job.attempts))
                    job.promoted_at = self.clock
                else:
                    job.events.append(
                        ("dependency_failed", "pending", "cancelled", job.token, job.attempts)
                    )
                    job.status = "cancelled"
                    job.last_error_code, job.last_error_class = "DEPENDENCY_FAILED", "permanent"

    def _check_key_order(self, job_id: int, job: JobModel) -> None:
        """README "Strict order per key": a keyed job starts only when no job of its key runs
        and every earlier one finished (succeeded, cancelled, dead-and-skipped). The one
        exception it documents: an earlier job replayed while this one had already started
        waits for this one to finish."""
        same_key = [(i, j) for i, j in self.model.items() if j.key == job.key and i != job_id]
        running = [i for i, j in same_key if j.status == "running"]
        assert not running, f"claim of job {job_id} while job {running} of key {job.key} runs"
        for i, earlier in same_key:
            if i > job_id or earlier.key_finished:
                continue
            overtaken = (
                earlier.replayed_at is not None
                and job.started is not None
                and job.started < earlier.replayed_at
            )
            assert overtaken, (
                f"claim of job {job_id} (key {job.key}) while earlier job {i} is "
                f"{earlier.status} (key_skipped={earlier.key_skipped})"
            )

    # -- fenced writes ---------------------------------------------------------------------

    def _act(self, lease: leaseq.Lease, action: str) -> None:
        """complete / fail:<mode> / heartbeat / release with ``lease``: exactly as the model
        predicts when the lease is current, refused without a trace when it is not."""
        mode = action.split(":")[1] if action.startswith("fail:") else ""

        def call() -> bool:
            if action == "complete":
                # Every completion stores its lease's token as the result.
                done = self.client.complete_many(
                    [lease], results={lease.job_id: (str(lease.token), 60.0)}
                )
                return lease.job_id in done
            if action == "heartbeat":
                return self.client.heartbeat(lease)
            if action == "release":
                return self.client.release(lease)
            if mode == "unknown":
                return self.client.fail(lease, "E_UNKNOWN", error_class="unknown")
            return self.client.fail(lease, f"E_{mode.upper()}", retryable=mode == "transient")

        if not self._lease_is_current(lease):
            self._refused(call, f"{action}{_key(lease)}")
            return
        assert call() is True, f"{action}{_key(lease)} refused a current lease"
        job = self.model[lease.job_id]
        if action == "complete":
            assert job.completions == 0, "a job succeeded twice"
            job.completions += 1
            job.status, job.owner = "succeeded", None
            self._finish_key(lease.job_id, "succeeded")
            self.results[lease.job_id] = lease.token
        elif action == "release":
            job.attempts -= 1
            if self._superseded(lease.job_id):  # its key moved on: it never runs again
                job.events.append(("released", "running", "cancelled", job.token, job.attempts))
                job.status, job.owner, job.last_error_code = "cancelled", None, "SUPERSEDED"
            else:
                job.events.append(("released", "running", "pending", job.token, job.attempts))
                job.status, job.owner = "pending", None
        elif mode:
            to, code = _failure_outcome(job, mode), f"E_{mode.upper()}"
            if self._superseded(lease.job_id) and _failure_outcome(job, mode, False) == "pending":
                to, code = "cancelled", "SUPERSEDED"  # its key moved on: not retried
            event = {"pending": "retry_scheduled", "dead": "dead", "cancelled": "cancelled"}[to]
            job.events.append((event, "running", to, job.token, job.attempts))
            job.status, job.owner = to, None
            job.unknown_failures += mode == "unknown"
            job.last_error_code, job.last_error_class = code, mode
            if to != "pending":
                self._finish_key(lease.job_id, to)
        self._settle()

    @rule(lease=leases, action=st.sampled_from(ACTIONS))
    def act_with_any_lease(self, lease: leaseq.Lease, action: str) -> None:
        """Any lease ever issued: after a while most are stale (re-claimed, finished, expired)."""
        self._act(lease, action)

    @precondition(lambda self: bool(self._ids(lambda j: j.live)))
    @rule(data=st.data(), action=st.sampled_from(ACTIONS), heartbeat_first=st.booleans())
    def act_with_held_lease(self, data: st.DataObject, action: str, heartbeat_first: bool) -> None:
        """The lease a worker currently holds on a running job."""
        job_id = data.draw(st.sampled_from(self._ids(lambda j: j.live)), label="job_id")
        lease = self.issued[(job_id, self.model[job_id].token)]
        if heartbeat_first:
            self._act(lease, "heartbeat")
        self._act(lease, action)

    # -- time, moved in the database ---------------------------------------------------------

    @precondition(lambda self: bool(self._ids(lambda j: j.live)))
    @rule(data=st.data(), then_sweep=st.booleans())
    def expire_lease(self, data: st.DataObject, then_sweep: bool) -> None:
        """A worker stalls past its lease: its expiry moves into the past (database clock)."""
        job_id = data.draw(st.sampled_from(self._ids(lambda j: j.live)), label="job_id")
        self._query(
            "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1 second' "
            "WHERE id = %s AND status = 'running' RETURNING id",
            job_id,
        )
        self.model[job_id].expired = True
        if then_sweep:
            self.sweep()

    @rule()
    def sweep(self) -> None:
        expired = self._ids(lambda j: j.status == "running" and j.expired)
        outcomes = {i: _failure_outcome(self.model[i], "transient") for i in expired}
        superseded = {
            i
            for i in expired
            if self._superseded(i)
            and _failure_outcome(self.model[i], "transient", False) == "pending"
        }
        outcomes.update({i: "cancelled" for i in superseded})
        result = self.client.sweep()
        for job_id, to in outcomes.items():
            job = self.model[job_id]
            job.events.append(("lease_expired", "running", to, job.token, job.attempts))
            job.status, job.owner, job.expired = to, None, False
            code = "SUPERSEDED" if job_id in superseded else "LEASE_EXPIRED"
            job.last_error_code, job.last_error_class = code, "transient"
            if to != "pending":
                self._finish_key(job_id, to)
        self._settle()
        tos = list(outcomes.values())
        # What the sweep reports must match what it did (one lease_expired event each).
        assert (result.requeued, result.dead, result.cancelled, result.total) == (
            tos.count("pending"),
            tos.count("dead"),
            tos.count("cancelled"),
            len(expired),
        ), f"sweep reported {result} for {outcomes}"

    @rule()
    def make_available(self) -> None:
        """Skip every back-off: scheduled retries become claimable now."""
        self._query(
            "UPDATE {s}.jobs SET available_at = now() WHERE status = 'pending' RETURNING id"
        )

    # -- operator actions --------------------------------------------------------------------

    def _cancel(self, job_id: int) -> None:
        job = self.model.get(job_id)
        if job is None or job.status not in ("pending", "running"):
            self._refused(lambda: self.client.cancel(job_id), f"cancel({job_id})")
            return
        assert self.client.cancel(job_id, actor="op", reason="test") is True
        if job.status == "pending":
            job.events.append(("cancelled", "pending", "cancelled", job.token, job.attempts))
            job.status, job.waiting = "cancelled", False
            self._finish_key(job_id, "cancelled")
            self._settle()
        else:
            job.events.append(("cancel_requested", "running", "running", job.token, job.attempts))
            job.cancel_requested = True

    def _replay(self, job_id: int, allow_cancelled: bool, with_dependents: bool = False) -> None:
        job = self.model.get(job_id)
        allowed = ("dead", "cancelled") if allow_cancelled else ("dead",)

        def call() -> bool:
            return self.client.replay(
                job_id,
                reason="fixed it",
                actor="op",
                allow_cancelled=allow_cancelled,
                with_dependents=with_dependents,
            )

        if job is None or job.status not in allowed:
            self._refused(call, f"replay({job_id}, allow_cancelled={allow_cancelled})")
            return
        if job.unique_key is not None and job.unique_key in self.holders:
            # Another job holds the key (live or its window): refused, audited, unchanged.
            holder = self.holders[job.unique_key][0]
            with pytest.raises(leaseq.ReplayRefused, match=f"held by job {holder}"):
                call()
            job.events.append(("replay_refused", job.status, job.status, job.token, job.attempts))
            return
        assert call() is True
        if job.unique_key is not None:
            self.holders[job.unique_key] = (job_id, False)
        back = [job_id]
        if with_dependents:
            # Jobs cancelled because this one (or one brought back) ended, transitively.
            frontier = [job_id]
            while frontier:
                here = frontier.pop()
                for i, j in self.model.items():
                    if (
                        here in j.deps
                        and i not in back
                        and j.status == "cancelled"
                        and j.last_error_code == "DEPENDENCY_FAILED"
                    ):
                        back.append(i)
                        frontier.append(i)
        self.clock += 1
        for i in back:
            again = self.model[i]
            again.events.append(("replayed", again.status, "pending", again.token, again.attempts))
            again.status, again.attempts, again.unknown_failures = "pending", 0, 0
            again.cancel_requested, again.replayed, again.key_skipped = False, True, False
            again.started, again.replayed_at = None, self.clock
            again.waiting = bool(again.deps)
        self._settle()

    def _skip(self, job_id: int) -> None:
        job = self.model.get(job_id)

        def call() -> bool:
            return self.client.skip_dead_head(job_id, reason="skip it", actor="op")

        if job is None or job.status != "dead" or job.key is None or job.key_skipped:
            self._refused(call, f"skip_dead_head({job_id})")
            return
        assert call() is True
        job.events.append(("key_skipped", "dead", "dead", job.token, job.attempts))
        job.key_skipped = True

    @rule(
        job_id=jobs,
        action=st.sampled_from(["cancel", "replay", "replay+cancelled", "replay+deps", "skip"]),
    )
    def operate_on_any_job(self, job_id: int, action: str) -> None:
        """Cancel, replay or skip any job, whatever its state (most are refused)."""
        if action == "cancel":
            self._cancel(job_id)
        elif action == "skip":
            self._skip(job_id)
        else:
            self._replay(
                job_id,
                allow_cancelled=action == "replay+cancelled",
                with_dependents=action == "replay+deps",
            )

    @precondition(lambda self: bool(self._ids(lambda j: j.status == "running")))
    @rule(data=st.data())
    def cancel_running_job(self, data: st.DataObject) -> None:
        """Cancel a job while a worker holds it (a random job is rarely running)."""
        self._cancel(data.draw(st.sampled_from(self._ids(lambda j: j.status == "running"))))

    @precondition(lambda self: bool(self._ids(lambda j: j.status in ("dead", "cancelled"))))
    @rule(
        data=st.data(),
        action=st.sampled_from(["replay", "replay+cancelled", "replay+deps", "skip"]),
    )
    def operate_on_finished_job(self, data: st.DataObject, action: str) -> None:
        """Replay or skip a dead or cancelled job (refused when it does not apply)."""
        job_id = data.draw(st.sampled_from(self._ids(lambda j: j.status in ("dead", "cancelled"))))
        if action == "skip":
            self._skip(job_id)
        else:
            self._replay(
                job_id,
                allow_cancelled=action == "replay+cancelled",
                with_dependents=action == "replay+deps",
            )

    @rule(error_code=st.sampled_from([None, "E_PERMANENT", "E_UNKNOWN", "LEASE_EXPIRED"]))
    def purge(self, error_code: str | None) -> None:
        """An operator deletes dead jobs without a key; each leaves a final 'purged' event."""
        kept = self._unfired_members()
        doomed = [
            job_id
            for job_id in self._ids(
                lambda j: (
                    j.status == "dead" and j.key is None and error_code in (None, j.last_error_code)
                )
            )
            if job_id not in kept  # a batch still counts it (issue 28, item 4)
        ]
        deleted = self.client.purge_dead(
            reason="clean up", actor="op", task=UNKEYED_TASK, error_code=error_code
        )
        assert deleted == len(doomed), f"purge deleted {deleted}, expected {doomed}"
        for job_id in doomed:
            job = self.model.pop(job_id)
            job.events.append(("purged", "dead", None, job.token, job.attempts))
            self.purged[job_id] = job

    @rule(older_than=st.sampled_from([0.001, 86400.0]))
    def prune(self, older_than: float) -> None:
        """Retention may delete succeeded and cancelled jobs, never unfinished or dead ones."""
        before = self._snapshot()
        deleted = self.client.prune(older_than=older_than)
        present = {row[0] for row in self._query("SELECT id FROM {s}.jobs")}
        gone = set(self.model) - present
        assert deleted == len(gone)
        assert not gone & self._unfired_members(), "pruned a member of an unfired batch"
        for job_id in gone:
            status = self.model.pop(job_id).status
            assert status in ("succeeded", "cancelled"), f"prune deleted {status} job {job_id}"
        if older_than > 3600:
            assert deleted == 0 and self._snapshot() == before

    # -- pauses ------------------------------------------------------------------------------

    def _paused(self, task: str) -> bool:
        return bool({("queue", "default"), ("task", task)} & self.paused)

    @rule(scope=st.sampled_from(PAUSE_SCOPES), cancel_running=st.booleans())
    def pause(self, scope: tuple[str, str], cancel_running: bool) -> None:
        """Claims of the scope stop; with cancel_running its running jobs are asked to stop."""
        kind, value = scope
        created = self.client.pause(
            **{kind: value}, reason="sm", actor="op", cancel_running=cancel_running
        )
        assert created == (scope not in self.paused)
        self.paused.add(scope)
        if not cancel_running:
            return
        for job_id in self._ids(lambda j: j.status == "running" and not j.cancel_requested):
            task = KEYED_TASK if self.model[job_id].key else UNKEYED_TASK
            if kind == "queue" or task == value:
                job = self.model[job_id]
                job.events.append(
                    ("cancel_requested", "running", "running", job.token, job.attempts)
                )
                job.cancel_requested = True

    @rule(scope=st.sampled_from(PAUSE_SCOPES))
    def resume(self, scope: tuple[str, str]) -> None:
        kind, value = scope
        assert self.client.resume(**{kind: value}, actor="op") == (scope in self.paused)
        self.paused.discard(scope)

    # -- limits ------------------------------------------------------------------------------

    @initialize(concurrency=st.sampled_from([None, 1, 2, 3]))
    def start_with_a_limit(self, concurrency: int | None) -> None:
        if concurrency is not None:
            self.set_queue_limit(concurrency)

    @rule(concurrency=st.sampled_from([None, 1, 2, 3]))
    def set_queue_limit(self, concurrency: int | None) -> None:
        """Set, change (lower too) or remove the queue's concurrency limit at any time."""
        if concurrency is None:
            assert self.client.remove_limit("queue:default") == (self.queue_limit is not None)
        else:
            if self.costly:
                concurrency = max(concurrency, MAX_COST)
            self.client.set_limit("queue:default", concurrency=concurrency, actor="op")
            self.limit_cap = max(self.limit_cap, concurrency)
        self.queue_limit = concurrency

    @invariant()
    def slots_match_running_jobs(self) -> None:
        """Slots held = the running leases claimed under the limit, each its cost in units
        (one for most), whatever ended or was refused since; never more units than the
        highest limit set, never a slot number twice (the primary key)."""
        slots = self._query("SELECT limit_name, slot, job_id, lease_token FROM {s}.held_slots")
        for name, claimed in (("queue:default", self.slotted), (TASK_LIMIT, self.task_slotted)):
            mine = Counter((job_id, token) for n, _, job_id, token in slots if n == name)
            expected = {
                (job_id, job.token)
                for job_id, job in self.model.items()
                if job.status == "running" and (job_id, job.token) in claimed
            }
            assert set(mine) == expected, f"{name}: slots {sorted(mine)}, expected {expected}"
            for (job_id, token), n in mine.items():
                cost = self.model[job_id].cost
                assert n == cost, f"{name}: lease {(job_id, token)} holds {n} units, cost {cost}"
            numbers = [slot for n, slot, _, _ in slots if n == name]
            assert len(numbers) == len(set(numbers)), f"{name}: a slot number held twice"
        assert all(name in ("queue:default", TASK_LIMIT) for name, _, _, _ in slots), slots
        queue_slots = [slot for name, slot, _, _ in slots if name == "queue:default"]
        assert len(queue_slots) <= self.limit_cap
        assert all(slot <= self.limit_cap for slot in queue_slots)

    @rule(on=st.booleans())
    def set_task_limit(self, on: bool) -> None:
        """A task limit created or removed at any time: the claims of its task take slot
        rows while it exists, and every path that ends those leases deletes them."""
        if on:
            self.client.set_limit(TASK_LIMIT, concurrency=1000, actor="op")
        else:
            assert self.client.remove_limit(TASK_LIMIT) == self.task_limit
        self.task_limit = on

    # -- batches -----------------------------------------------------------------------------

    @precondition(lambda self: self._unfinished() < MAX_UNFINISHED)
    @rule(target=jobs, attempts=st.lists(st.integers(1, 3), min_size=1, max_size=3))
    def enqueue_batch(self, attempts: list[int]) -> Any:
        """A sealed batch with success and failure callbacks (on a queue of their own)."""
        callback = leaseq.Sig(CALLBACK_TASK, options={"queue": CALLBACK_QUEUE})
        with self.client.batch(on_success=callback, on_failure=callback) as batch:
            ids = batch.enqueue_many([{"task": UNKEYED_TASK, "max_attempts": m} for m in attempts])
        members = [int(i) for i in ids]
        for job_id, m in zip(members, attempts, strict=True):
            assert job_id not in self.model
            self.model[job_id] = JobModel(max_attempts=m)
        self.batches[batch.id] = members
        return multiple(*members)

    def _unfired_members(self) -> set[int]:
        return {m for b, members in self.batches.items() if b not in self.fired for m in members}

    @invariant()
    def batches_fire_once(self) -> None:
        """A batch fires once, in the transition that ended its last member: on_success
        when every member succeeded, on_failure otherwise, with the counts of its members
        (none of them pruned or purged before that); never before, never twice."""
        fired: dict[int, list[tuple[str, Any]]] = {}
        for batch_id, kind, payload in self._query(
            "SELECT c.batch_id, c.kind, j.payload FROM {s}.batch_callbacks AS c "
            "LEFT JOIN {s}.jobs AS j ON j.id = c.job_id ORDER BY c.batch_id"
        ):
            fired.setdefault(batch_id, []).append((kind, payload))
        assert set(fired) <= set(self.batches), f"callbacks of unknown batches {fired}"
        for batch_id, members in self.batches.items():
            got = [kind for kind, _ in fired.get(batch_id, [])]
            if batch_id in self.fired:
                assert got == [self.fired[batch_id]], f"batch {batch_id} fired {got}"
                continue
            statuses = [self.model[m].status for m in members]  # none gone while unfired
            if not all(status in TERMINAL for status in statuses):
                assert got == [], f"batch {batch_id} fired {got} with members {statuses}"
                continue
            kind = "success" if all(st_ == "succeeded" for st_ in statuses) else "failure"
            assert got == [kind], f"batch {batch_id} fired {got}, expected {kind}: {statuses}"
            ((_, payload),) = fired[batch_id]
            counts = {k: statuses.count(k) for k in ("succeeded", "dead", "cancelled")}
            assert payload["total"] == len(members), payload
            assert {k: payload[k] for k in counts} == counts, (payload, statuses)
            self.fired[batch_id] = kind

    # -- stored results ------------------------------------------------------------------------

    @invariant()
    def results_come_from_the_final_lease(self) -> None:
        """A stored result exists only for a job that succeeded, written by the lease that
        completed it (its value is that lease's token), and outlives retention."""
        stored = {
            job_id: (value, token)
            for job_id, value, token in self._query(
                "SELECT job_id, value, lease_token FROM {s}.job_results"
            )
        }
        expected = {job_id: (token, token) for job_id, token in self.results.items()}
        assert stored == expected, f"results {stored}, expected {expected}"
        for job_id in stored:
            job = self.model.get(job_id)
            assert job is None or (job.status == "succeeded" and job.token == stored[job_id][1])

    @invariant()
    def pauses_match_model(self) -> None:
        stored = {(p.scope, p.value) for p in self.client.pauses()}
        assert stored == self.paused, f"pauses {stored}, expected {self.paused}"

    # -- invariants, checked against the database after every step ------------------------------

    @invariant()
    def jobs_match_model(self) -> None:
        rows = self._query(
            "SELECT id, status::text, lease_owner, lease_expires_at IS NOT NULL, "
            "lease_expires_at > now(), lease_token, attempt_count, max_attempts, "
            "unknown_failures, cancel_requested_at IS NOT NULL, finished_at IS NOT NULL, "
            "last_error_code, last_error_class, ordering_key, key_skipped, waiting "
            "FROM {s}.jobs WHERE queue_name = 'default' ORDER BY id"
        )
        # 3. Count in = count out: every job enqueued is still there unless retention
        #    pruned it (prune() checked it was finished), each in exactly one state.
        assert [r[0] for r in rows] == sorted(self.model), "jobs appeared or vanished"
        for (
            job_id,
            status,
            owner,
            has_expiry,
            unexpired,
            token,
            attempts,
            max_attempts,
            unknown,
            cancel_requested,
            finished,
            error_code,
            error_class,
            key,
            key_skipped,
            waiting,
        ) in rows:
            job = self.model[job_id]
            where = f"job {job_id}"
            assert status == job.status, f"{where}: status {status}, expected {job.status}"
            # 1. At most one live lease: running <=> owner and expiry set, and the owner is
            #    the worker the model says holds it; its expiry is past only if we moved it.
            assert (status == "running") == (owner is not None and has_expiry), where
            assert owner == job.owner, f"{where}: owner {owner}, expected {job.owner}"
            if status == "running":
                assert unexpired == (not job.expired), f"{where}: lease expiry"
            # Tokens never go down, and move only with claims (+1 each, checked in claim).
            assert token >= self.seen_tokens.get(job_id, 0), f"{where}: token went down"
            self.seen_tokens[job_id] = token
            assert token == job.token, f"{where}: token {token}, expected {job.token}"
            # 5. Attempts stay within the budget (replay resets it, so this holds for all);
            #    a job with no attempt left is never pending (dead, not deleted).
            assert attempts == job.attempts, f"{where}: attempts {attempts} != {job.attempts}"
            assert max_attempts == job.max_attempts, where
            assert attempts <= max_attempts, f"{where}: {attempts} > {max_attempts} attempts"
            if status == "pending":
                assert attempts < max_attempts, f"{where}: pending with no attempts left"
            assert unknown == job.unknown_failures, where
            assert cancel_requested == job.cancel_requested, f"{where}: cancel request"
            # 4. succeeded is final and reached once.
            assert job.completions == (1 if status == "succeeded" else 0), where
            # Terminal <=> finished_at.
            assert finished == (status in TERMINAL), f"{where}: {status} finished={finished}"
            assert (error_code, error_class) == (job.last_error_code, job.last_error_class), where
            assert (key, key_skipped) == (job.key, job.key_skipped), where
            assert waiting == job.waiting, f"{where}: waiting {waiting}, expected {job.waiting}"

    @invariant()
    def no_job_waits_for_nothing(self) -> None:
        """A job stored waiting has an unfinished dependency and no failed "cancel" one:
        the commit that ended its last dependency promoted it (no later step needed)."""
        for (job_id,) in self._query("SELECT id FROM {s}.jobs WHERE waiting"):
            state = self._dep_state(self.model[job_id])
            assert state == "wait", f"job {job_id} waits, but its dependencies say {state}"

    @invariant()
    def unique_keys_hold(self) -> None:
        """Who holds each unique key is what the model says; at most one live job holds a
        key, and every live keyed job that is not superseded holds its own key."""
        held = {
            key: (job_id, window)
            for key, job_id, window in self._query(
                "SELECT unique_key, job_id, held_until IS NOT NULL FROM {s}.unique_keys"
            )
        }
        assert held == self.holders, f"unique_keys {held}, expected {self.holders}"
        live = self._query(
            "SELECT unique_key, id FROM {s}.jobs "
            "WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')"
        )
        for key, job_id in live:
            holds = held.get(key) == (job_id, False)
            assert holds or self._superseded(job_id), f"live job {job_id} lost key {key}"
        for key, (job_id, window) in held.items():
            if not window:
                assert self.model[job_id].status in ("pending", "running"), (key, job_id)

    @invariant()
    def audit_trail_matches_model(self) -> None:
        """6. Every transition other than claim and complete left exactly the event the model
        expects, in order, with its token and attempt (and nothing else was written)."""
        events: dict[int, list[Event]] = {}
        for job_id, *event in self._query(
            "SELECT job_id, event, from_status::text, to_status::text, lease_token, attempt "
            "FROM {s}.job_events ORDER BY id"
        ):
            events.setdefault(job_id, []).append(tuple(event))
        assert set(events) <= set(self.model) | set(self.purged), "events of pruned jobs"
        for job_id, job in (self.model | self.purged).items():
            assert events.get(job_id, []) == job.events, f"job {job_id}: audit trail differs"

    @invariant()
    def trail_follows_the_transition_table(self) -> None:
        """Oracle: every stored event is a transition of ``states.TRANSITIONS`` (an unknown
        name fails), and each job's trail is a path through the table: from enqueue to the
        first event, between events, and from the last event to the row's status, only
        transitions that write no event may happen."""
        trails: dict[int, list[tuple[str, str | None, str | None]]] = {}
        for job_id, event, src, dst in self._query(
            "SELECT job_id, event, from_status::text, to_status::text FROM {s}.job_events "
            "ORDER BY id"
        ):
            assert allowed(event, src, dst), (
                f"job {job_id}: stored event {event} {src} -> {dst} is not in states.TRANSITIONS"
            )
            trails.setdefault(job_id, []).append((event, src, dst))
        status_now = dict(self._query("SELECT id, status::text FROM {s}.jobs"))
        for job_id, trail in trails.items():
            here: str | None = str(JobStatus.PENDING)  # enqueued
            for event, src, dst in trail:
                assert src in _unrecorded_reach(here), (
                    f"job {job_id}: {event} from {src}, but the trail left it {here}"
                )
                here = dst
            final = status_now.get(job_id)
            assert final in _unrecorded_reach(here), (
                f"job {job_id}: row is {final}, but the trail left it {here}"
            )

    @invariant()
    def ordering_keys_hold(self) -> None:
        """README "Strict order per key": at most one job of a key is active (pending and
        not blocked, or running); a pending head has no earlier unfinished job (a running
        one may: a job replayed after it started waits for it); nothing after a dead head
        under "block" is active; and blocked jobs always have something to wait for (else the
        key would be stuck for good)."""
        keyed: dict[str, list[tuple[int, str, bool, bool]]] = {}
        for key, job_id, status, blocked, dead_block in self._query(
            "SELECT ordering_key, id, status::text, blocked, "
            "status = 'dead' AND key_policy = 'block' AND NOT key_skipped "
            "FROM {s}.jobs WHERE ordering_key IS NOT NULL ORDER BY id"
        ):
            keyed.setdefault(key, []).append((job_id, status, blocked, dead_block))
            assert not (blocked and status == "running"), f"job {job_id} runs while blocked"
        for key, jobs in keyed.items():
            active = [
                (job_id, status)
                for job_id, status, blocked, _ in jobs
                if status == "running" or (status == "pending" and not blocked)
            ]
            assert len(active) <= 1, f"key {key} has several active heads: {jobs}"
            blockers = [job_id for job_id, _, _, dead_block in jobs if dead_block]
            for job_id, status in active:
                assert not [b for b in blockers if b < job_id], (
                    f"key {key}: job {job_id} is active behind a dead head: {jobs}"
                )
                if status == "pending":
                    early = [i for i in self.model if self.model[i].key == key and i < job_id]
                    unfinished = [i for i in early if not self.model[i].key_finished]
                    assert not unfinished, f"key {key}: head {job_id} is ahead of {unfinished}"
            waiting = [
                job_id for job_id, status, blocked, _ in jobs if status == "pending" and blocked
            ]
            assert not waiting or active or blockers, (
                f"key {key}: jobs {waiting} blocked behind nothing"
            )


@pytest.fixture()
def machine_dsn(dsn: str) -> Iterator[str]:
    """Hands the session's DSN to the machine class, which cannot take fixtures itself."""
    LeaseqMachine.dsn = dsn
    yield dsn
    LeaseqMachine.dsn = ""


@pytest.mark.slow  # 100 examples of 50 steps, each on a fresh schema
def test_random_interleavings_keep_the_invariants(
    machine_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every example builds and drops a schema (~0.1 s), so shrinking a failure could take
    # Hypothesis's full 300 s budget and meet pytest's timeout (300 s) before reporting
    # anything. Cap it: the report may be less minimal, and .hypothesis/ keeps the example
    # (it is replayed first next time). Its warning still says "five minutes"; it was 45 s.
    monkeypatch.setattr(hypothesis_engine, "MAX_SHRINKING_SECONDS", 45, raising=False)
    run_state_machine_as_test(
        LeaseqMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
