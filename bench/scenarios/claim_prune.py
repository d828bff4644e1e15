"""The ``claim-under-prune`` scenario: claims and completions on one connection, alone
and while ``Client.prune`` removes old finished jobs on another, with the ratios that say
whether the prune slows the claims down."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

import leaseq
from bench.db import (
    CLAIM_LIMIT,
    OLD_SUCCEEDED_ROWS,
    PENDING_ROWS,
    claim_and_complete,
    claim_params,
    connect,
    fresh_schema,
    insert_rows,
    settle,
    status_counts,
)
from bench.harness import BenchError, Metric, Ratio, Sample, Scenario, Settings, ms, percentile
from leaseq.sql import Queries

NAME = "claim-under-prune"
PRUNE_AGE = 86400.0  # prune(older_than=...); the old rows are 10 days old
PRUNE_BATCH = 1000


class PruneThread(threading.Thread):
    """Runs ``Client.prune`` until a call prunes nothing; records when it stopped."""

    def __init__(self, client: leaseq.Client) -> None:
        super().__init__(name="bench-prune", daemon=True)
        self.client = client
        self.pruned = 0
        self.started_at = 0.0
        self.finished_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        self.started_at = time.perf_counter()
        try:
            while n := self.client.prune(older_than=PRUNE_AGE, batch_size=PRUNE_BATCH):
                self.pruned += n
        except BaseException as exc:  # re-raised by the scenario, in the main thread
            self.error = exc
        finally:
            self.finished_at = time.perf_counter()

    def wait(self) -> None:
        if self.ident is not None:  # started
            self.join()


@dataclass
class ClaimRun:
    """Every claim+complete round trip of one claim-under-prune run."""

    starts: list[float]  # perf_counter() at each round trip's start
    latencies: list[float]  # seconds, each round trip
    seconds: float  # the whole run
    pruner: PruneThread | None


def claim_run(settings: Settings, with_prune: bool) -> ClaimRun:
    with fresh_schema(settings.dsn, NAME) as client:
        schema = client.schema
        with connect(settings.dsn) as conn:
            insert_rows(conn, schema, OLD_SUCCEEDED_ROWS, settings.prune_old)
            insert_rows(conn, schema, PENDING_ROWS, settings.jobs)
            settle(conn, schema, settings.checkpoint)
        queries = Queries(schema)
        claim, complete = queries["claim_jobs"], queries["complete_jobs"]
        params = claim_params(f"bench-claim:{os.getpid()}", CLAIM_LIMIT)
        run = ClaimRun([], [], 0.0, None)
        done = 0
        with contextlib.ExitStack() as stack:
            if with_prune:
                prune_client = stack.enter_context(
                    leaseq.Client(settings.dsn, schema=schema, pool_size=1)
                )
                prune_client.check_schema()  # opens its pool before the clock starts
                run.pruner = PruneThread(prune_client)
                stack.callback(run.pruner.wait)  # ends before the client closes, even on error
            conn = stack.enter_context(connect(settings.dsn))
            if run.pruner is not None:
                run.pruner.start()
            started = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                n = claim_and_complete(conn, claim, complete, params)[0]
                if not n:
                    break
                run.latencies.append(time.perf_counter() - t0)
                run.starts.append(t0)
                done += n
            run.seconds = time.perf_counter() - started
        if run.pruner is not None and run.pruner.error is not None:
            raise BenchError(f"prune failed: {run.pruner.error!r}") from run.pruner.error
        counts = status_counts(settings.dsn, schema)
    pruned = 0 if run.pruner is None else run.pruner.pruned
    if pruned not in (0, settings.prune_old) or (with_prune and pruned == 0):
        raise BenchError(f"prune removed {pruned} of {settings.prune_old} old jobs: {counts}")
    if done != settings.jobs or counts.get("succeeded", 0) != settings.jobs + (
        settings.prune_old - pruned
    ):
        raise BenchError(
            f"claim-under-prune completed {done} of {settings.jobs} pending jobs: {counts}"
        )
    return run


def claim_under_prune(settings: Settings) -> dict[str, Sample]:
    """The same table twice (old succeeded jobs + N pending), each in a fresh schema: the
    N pending jobs claimed and completed LIMIT 10 at a time, alone, then while another
    connection prunes every old row. The prune usually ends before the claims do, so the
    side-by-side figures cover the K claims made while it ran, against the same first K
    claims of the run without it (same jobs, same table state)."""
    alone = claim_run(settings, with_prune=False)
    pruned = claim_run(settings, with_prune=True)
    pruner = pruned.pruner
    assert pruner is not None
    k = sum(1 for t in pruned.starts if t < pruner.finished_at)
    if k < 10:
        raise BenchError(
            f"claim-under-prune: the prune ended after {k} claims; raise --prune-old so it "
            "overlaps more of them"
        )
    out: dict[str, Sample] = {}
    for tag, run in (("alone", alone), ("prune", pruned)):
        window = run.latencies[:k]
        out[f"cup-{tag}-rate"] = Sample(k, sum(window))
        out[f"cup-{tag}-p50"] = Sample(k, sum(window), ms(percentile(window, 50)))
        out[f"cup-{tag}-p99"] = Sample(k, sum(window), ms(percentile(window, 99)))
        out[f"cup-{tag}-all"] = Sample(len(run.latencies), run.seconds)
    out["cup-prune-rows"] = Sample(pruner.pruned, pruner.finished_at - pruner.started_at)
    return out


SCENARIO = Scenario(
    NAME,
    "claiming N pending jobs (LIMIT 10) next to old finished ones, alone and while "
    "Client.prune removes the old ones",
    (
        Metric("cup-alone-rate", NAME, "first K claims, no prune", "claims/s"),
        Metric("cup-prune-rate", NAME, "K claims made while prune ran", "claims/s"),
        Metric("cup-alone-p50", NAME, "first K claims, no prune, p50", "ms"),
        Metric("cup-prune-p50", NAME, "K claims made while prune ran, p50", "ms"),
        Metric("cup-alone-p99", NAME, "first K claims, no prune, p99", "ms"),
        Metric("cup-prune-p99", NAME, "K claims made while prune ran, p99", "ms"),
        Metric("cup-alone-all", NAME, "all N/10 claims, no prune", "claims/s"),
        Metric("cup-prune-all", NAME, "all N/10 claims, prune running at first", "claims/s"),
        Metric("cup-prune-rows", NAME, "prune (batches of 1000), next to the claims", "rows/s"),
    ),
    claim_under_prune,
)

RATIOS = (
    Ratio("claims/s while pruning / no prune (K claims)", "cup-prune-rate", "cup-alone-rate"),
    Ratio("claim p50 while pruning / no prune (K claims)", "cup-prune-p50", "cup-alone-p50"),
    Ratio("claim p99 while pruning / no prune (K claims)", "cup-prune-p99", "cup-alone-p99"),
    Ratio("claims/s with prune / no prune (all N/10)", "cup-prune-all", "cup-alone-all"),
)
