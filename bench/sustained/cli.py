"""The sustained run's command line and its course: a fresh schema, the workers, the
producer, a snapshot every interval; SIGTERM and Ctrl-C stop it cleanly, and an error is
one line on stderr."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TypeVar

import psycopg

from bench.db import connect, fresh_schema, server_info
from bench.harness import REPO_ROOT, BenchError, resolve_bench_dsn
from bench.sustained.model import Options
from bench.sustained.report import Run, header, progress_line, report
from bench.sustained.sampling import (
    Producer,
    has_statements,
    interval_between,
    producing,
    take_snapshot,
)
from bench.sustained.server import own_server
from bench.sustained.workers import Worker, running_workers
from leaseq import validate
from leaseq.errors import ConfigError, DatabaseUnavailable, LeaseqError

DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "sustained.json"

N = TypeVar("N", int, float)


class Stop(KeyboardInterrupt):
    """SIGTERM to this process: stop as cleanly as on Ctrl-C."""


def wait_until(deadline: float, workers: Sequence[Worker], producer: Producer) -> None:
    """Sleep until ``deadline``, checking each second that nothing has died, so a dead
    worker ends the run at once rather than at the next sample."""
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
        producer.check()
        for w in workers:
            w.check_alive()


def run_sustained(opts: Options, run: Run) -> None:
    """A fresh schema, the workers, the producer; a snapshot at the start and one every
    interval. The contexts unwind in order: producer, workers (SIGTERM), schema."""
    with (
        tempfile.TemporaryDirectory(prefix="leaseq-sustained-") as log_dir,
        fresh_schema(opts.dsn, "sustained", offload_above=opts.offload_above) as client,
        connect(opts.dsn) as conn,
        running_workers(opts, client.schema, log_dir, run.workers) as workers,
    ):
        statements = has_statements(conn)
        before = take_snapshot(conn, client, workers, None, statements)
        with producing(client, opts.rate, opts.payload_bytes) as producer:
            started = producer.started_at
            before = dataclasses.replace(before, at=started)
            for i in range(1, opts.samples + 1):
                wait_until(started + i * opts.interval, workers, producer)
                producer.check()
                after = take_snapshot(conn, client, workers, producer, statements)
                run.intervals.append(interval_between(before, after, started))
                print(progress_line(run.intervals[-1]), file=sys.stderr, flush=True)
                before = after


def positive(kind: Callable[[str], N]) -> Callable[[str], N]:
    """An argparse type: ``kind(text)``, which must be above 0."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def retention_arg(text: str) -> str:
    """Checked here, so a typo fails before the schema and the worker are set up."""
    return text if text == "never" else duration_arg(text)


def duration_arg(text: str) -> str:
    try:
        validate.parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_args(argv: Sequence[str] | None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m bench.sustained",
        description="leaseq at a fixed offered load for minutes: does throughput decay "
        "while the jobs table, its indexes and its dead tuples evolve?",
    )
    p.add_argument(
        "--dsn", default=None, help="PostgreSQL DSN (default: env LEASEQ_DSN, else embedded)"
    )
    p.add_argument(
        "--own-server",
        action="store_true",
        help="run on a new embedded server of its own (temporary data directory, free port, "
        "pg_stat_statements loaded), stopped and removed afterwards",
    )
    p.add_argument("--minutes", type=positive(float), default=10.0, help="run length")
    p.add_argument("--rate", type=positive(float), default=5000.0, help="offered jobs/s")
    p.add_argument("--interval", type=positive(float), default=30.0, help="seconds between samples")
    p.add_argument(
        "--retention",
        type=retention_arg,
        default="60s",
        help="the worker's --retention (default 60s, so the table can reach a steady size)",
    )
    p.add_argument(
        "--prune-interval",
        type=duration_arg,
        default="15s",
        help="the worker's --prune-interval (default 15s)",
    )
    p.add_argument("--concurrency", "-c", type=positive(int), default=200)
    p.add_argument("--batch", "-b", type=positive(int), default=100, help="--batch-size")
    p.add_argument("--workers", type=positive(int), default=1, help="worker processes")
    p.add_argument(
        "--payload-bytes",
        type=positive(int),
        default=None,
        help="give each job a payload of about this many bytes of random text "
        "(default: a few bytes); e.g. 1000000 with a --rate of tens of jobs/s",
    )
    p.add_argument(
        "--offload-above",
        type=positive(int),
        default=None,
        help="the producer's offload_above: payloads over this many bytes go to the "
        "payloads table, not the jobs row (docs/payloads.md)",
    )
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help="JSON results file (default: bench/results/sustained.json)",
    )
    args = p.parse_args(argv)
    if args.interval > args.minutes * 60:
        p.error("--interval is longer than the run")
    if args.own_server and args.dsn:
        p.error("--own-server and --dsn exclude each other")
    return Options(
        dsn="" if args.own_server else resolve_bench_dsn(args.dsn),
        minutes=args.minutes,
        rate=args.rate,
        interval=args.interval,
        retention=args.retention,
        prune_interval=args.prune_interval,
        concurrency=args.concurrency,
        batch=args.batch,
        workers=args.workers,
        own_server=args.own_server,
        out=args.out,
        payload_bytes=args.payload_bytes or 0,
        offload_above=args.offload_above,
    )


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Stop


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def failure(exc: BaseException) -> int:
    """One line on stderr, exit status 1: a dead worker, an unreachable database."""
    if isinstance(exc, psycopg.OperationalError | DatabaseUnavailable):
        print(f"sustained: error: database unreachable: {first_line(exc)}", file=sys.stderr)
    else:
        print(f"sustained: error: {first_line(exc)}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        opts = parse_args(argv)  # may start the shared embedded server
        if not opts.own_server:
            return measure(opts)
        with own_server(opts.out.with_suffix(".autovacuum.log")) as dsn:
            return measure(dataclasses.replace(opts, dsn=dsn))
    except KeyboardInterrupt:
        return 130
    except (LeaseqError, psycopg.Error) as exc:
        return failure(exc)


def measure(opts: Options) -> int:
    """The run on ``opts.dsn``, its report; the exit status."""
    info = server_info(opts.dsn)
    print(header(opts, info), file=sys.stderr, flush=True)
    run = Run()
    try:
        run_sustained(opts, run)
    except KeyboardInterrupt:
        print("sustained: interrupted", file=sys.stderr)
        if not run.intervals:
            return 130
        run.interrupted = True
    except (BenchError, LeaseqError, psycopg.Error) as exc:
        return failure(exc)
    report(opts, info, run)
    return 130 if run.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
