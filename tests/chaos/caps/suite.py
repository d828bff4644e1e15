"""The capability part of a chaos run: every capability's workload, the sampler, the end
checks, and their figures (used by tests/chaos/harness.py's ChaosRun).

The sampler is a thread of the harness with its own connection (straight to the server,
never through a worker's fault proxy): every ``interval`` seconds it asks each capability
what is wrong at that instant; while the server restarts it reconnects and counts the
samples it missed. Each violation is recorded once (its first instant) with how often it
was seen."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from typing import Any

import psycopg

from tests.chaos.caps.base import Capability, CapContext
from tests.chaos.caps.batches import Batches
from tests.chaos.caps.deadlines import Deadlines
from tests.chaos.caps.deps import Dependencies
from tests.chaos.caps.limits import Limits
from tests.chaos.caps.results import Results
from tests.chaos.caps.schedules import Schedules
from tests.chaos.caps.steps import Steps
from tests.chaos.caps.unique import UniqueKeys
from tests.chaos.caps.waits import Waits

#: One entry per capability; a new capability is a module with a Capability subclass here.
CAPABILITIES: tuple[type[Capability], ...] = (
    UniqueKeys,
    Limits,
    Schedules,
    Dependencies,
    Batches,
    Results,
    Steps,
    Deadlines,
    Waits,
)

MAX_KEPT = 20  # violations kept per check (all are counted)


class CapSuite:
    def __init__(self, ctx: CapContext, interval: float = 0.1) -> None:
        self.ctx = ctx
        self.interval = interval
        self.caps = [cls() for cls in CAPABILITIES]
        self.threads: list[threading.Thread] = []
        self.samples = 0
        self.missed = 0
        self.sampled: dict[str, dict[str, tuple[float, int]]] = {c.name: {} for c in self.caps}
        self.ended: dict[str, list[str]] = {}
        self.crashed: list[str] = []
        self.enqueue_seconds: dict[str, float] = {}
        self._began = time.time()

    def setup(self) -> None:
        for cap in self.caps:
            cap.setup(self.ctx)

    def enqueue(self) -> None:
        for cap in self.caps:
            began = time.monotonic()
            cap.enqueue(self.ctx)
            self.enqueue_seconds[cap.name] = time.monotonic() - began

    def start(self) -> None:
        """The producers and the sampler, from now until ``stop``."""
        self._began = time.time()
        # The producers' pools log each connection a fault broke: expected here, noise.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        for cap in self.caps:
            if cap.has_producer:
                self.threads.append(self._thread(f"produce-{cap.name}", cap.produce, self.ctx))
        self.sampler_stop = threading.Event()
        self.threads.append(self._thread("sampler", self._sample_loop))

    def _thread(self, name: str, fn: Any, *args: Any) -> threading.Thread:
        def run() -> None:
            try:
                fn(*args)
            except Exception as exc:  # a broken producer must show, not end the run quietly
                self.crashed.append(f"{name}: {type(exc).__name__}: {exc}")

        thread = threading.Thread(target=run, name=f"chaos-{name}", daemon=True)
        thread.start()
        return thread

    def window_over(self) -> None:
        self.ctx.stop.set()
        for cap in self.caps:
            try:
                cap.window_over(self.ctx)
            except psycopg.Error as exc:
                self.crashed.append(f"{cap.name}.window_over: {exc}")

    def stop(self) -> None:
        self.ctx.stop.set()
        self.sampler_stop.set()
        for thread in self.threads:
            thread.join(30)

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.ctx.dsn, autocommit=True, application_name="chaos-sampler", connect_timeout=2
        )

    def _sample_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self.sampler_stop.wait(self.interval):
            try:
                if conn is None:
                    conn = self._connect()
                for cap in self.caps:
                    self._record(cap.name, cap.sample(self.ctx, conn))
                self.samples += 1
            except psycopg.Error:
                self.missed += 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _record(self, name: str, found: list[str]) -> None:
        seen = self.sampled[name]
        now = time.time() - self._began
        for text in found:
            first, n = seen.get(text, (now, 0))
            seen[text] = (first, n + 1)

    def final(self) -> None:
        with self._connect() as conn:
            for cap in self.caps:
                self.ended[cap.name] = cap.final(self.ctx, conn)

    # -- the report ---------------------------------------------------------------------

    def violations(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for cap in self.caps:
            seen = sorted(self.sampled[cap.name].items(), key=lambda kv: kv[1][0])
            out[f"{cap.name}: sampled"] = [
                f"t+{first:.1f}s ({n} samples) {text}" for text, (first, n) in seen
            ]
            out[f"{cap.name}: at the end"] = list(self.ended.get(cap.name, []))
        out["capability threads"] = list(self.crashed)
        return out

    def summary(self) -> list[str]:
        lines = [
            f"  capabilities: {self.samples} sampled instants every {self.interval:g}s "
            f"({self.missed} missed while the server was unreachable); enqueued in "
            + " ".join(f"{k}={v:.1f}s" for k, v in self.enqueue_seconds.items() if v >= 0.05)
        ]
        for cap in self.caps:
            lines.append(f"    {cap.name}: {cap.figures()}")
        return lines

    def counts(self) -> dict[str, Counter[str]]:
        return {cap.name: cap.counts for cap in self.caps}
