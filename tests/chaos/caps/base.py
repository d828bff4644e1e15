"""What one capability's part of the chaos run is: its workload and its checks.

A :class:`Capability` sets up what it needs (limits, schedules), enqueues its jobs before
the window (due over it), may keep producing during the window from a thread of the
harness (unique keys, a limit that comes and goes), says at each sampled instant what is
wrong right now (``sample``: one or a few reads, each one snapshot of the database), and
after the run, when every worker has stopped and a last sweep ran, what is wrong at the
end (``final``). ``figures`` are printed with the run's summary.

The jobs it enqueues run the handlers of tests/chaos/app.py (``chaos.cap*``), whose
execution logs go to ``CapContext.out``; they never carry the ``seq`` of the plain jobs,
which the harness's own four checks are about.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from tests.chaos.execlog import Execution, read_executions

SCHEMA = "chaos"


@dataclass
class CapContext:
    """What a capability gets from the run."""

    dsn: str
    seed: int
    out: pathlib.Path
    #: Wall-clock start of the chaos window and its length (seconds).
    start: dt.datetime
    seconds: float
    lease: float
    schema: str = SCHEMA
    stop: threading.Event = field(default_factory=threading.Event)

    def rng(self, name: str) -> random.Random:
        return random.Random(f"{self.seed}:{name}")

    def payload(
        self,
        rng: random.Random,
        *,
        work: tuple[float, float] = (0.05, 0.4),
        long_share: float = 0.05,
        mode: str = "ok",
        **extra: Any,
    ) -> dict[str, Any]:
        """A handler payload: work some time (now and then longer than a lease), then
        behave as ``mode`` says (ok, flaky: Retry on attempt 1, poison: Permanent)."""
        seconds = rng.uniform(
            *((1.5 * self.lease, 3.0 * self.lease) if rng.random() < long_share else work)
        )
        steps = max(1, round(seconds / 0.05))
        return {
            "n": steps,
            "s": round(seconds / steps, 4),
            "mode": mode,
            "out": str(self.out),
            **extra,
        }

    def count(self, per_second: float, least: int = 10) -> int:
        """How many jobs (or groups) a workload spreads over the window."""
        return max(least, round(per_second * self.seconds))

    def at(self, share: float) -> dt.datetime:
        """The instant ``share`` (0..1) of the way through the window."""
        return self.start + dt.timedelta(seconds=self.seconds * share)

    def client(self) -> leaseq.Client:
        return leaseq.Client(
            self.dsn, schema=self.schema, application_name="chaos-harness", pool_size=2
        )

    def table(self, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(name))

    def executions(self) -> list[Execution]:
        return read_executions(self.out)


class Capability:
    """One capability's workload and checks; subclasses override what they need."""

    name = "capability"

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def setup(self, ctx: CapContext) -> None:
        """Before the workers start (limits, schedules)."""

    def enqueue(self, ctx: CapContext) -> None:
        """Before the window: the jobs, due over it."""

    def produce(self, ctx: CapContext) -> None:
        """During the window, in a thread of its own, until ``ctx.stop`` is set."""

    def window_over(self, ctx: CapContext) -> None:
        """The window ended: stop making new work (the run then drains)."""

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        """What is wrong at this instant (each read is one snapshot)."""
        return []

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        """What is wrong after the run (workers stopped, a last sweep ran)."""
        return []

    def figures(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "-"

    @property
    def has_producer(self) -> bool:
        return type(self).produce is not Capability.produce
