"""Run the leaseq chaos harness by hand, longer than CI does.

    python -m tests.chaos --jobs 100000 --minutes 10 --workers 4 --seed 7

Starts a private PostgreSQL, worker processes behind fault proxies, and a seeded fault
schedule (kill -9, SIGSTOP past the lease, pg_terminate_backend, PostgreSQL restarts,
dropped / stalled / half-open connections); then checks that every job ended, that no job
succeeded under a stale token, that the in-database effect of each job exists exactly once,
and that duplicate executions stayed within lease + sweep interval (+ margin). Prints the
figures; exits 1 if an invariant was violated (the message names the seed). The same
``--seed`` (with the same window, workers, lease and sweep) gives the same fault schedule;
``--print-schedule`` shows it without running anything.

See tests/chaos/harness.py for what exactly is injected and checked.

The failover run on a real Patroni cluster is the ``failover`` command of the same module:

    python -m tests.chaos failover --jobs 20000 --seed 7 --minutes 10 --async

It starts etcd and Patroni-managed PostgreSQL nodes, worker processes on the multi-host DSN,
and a seeded schedule of switchovers and hard failovers (kill -9 of the primary's Patroni
and postmaster), in asynchronous (default) or Patroni's synchronous mode; prints one line
``failover: jobs=… lost=… stale_success=… double_effects=… duplicates=… reappeared=…
failovers=…`` and exits 1 if an invariant broke (tests/chaos/failover.py has the harness
and the exact definitions). Round 2, as root: three nodes, synchronous_mode_strict, and a
worker host that partitions cut off from the primary while it holds leases:

    python -m tests.chaos failover --sync --strict --nodes 3 --host-workers 1 --minutes 10
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import random
import sys

from tests.chaos.failover import FailoverConfig, run_failover
from tests.chaos.harness import ChaosConfig, fingerprint, run_chaos

FAILOVER_DOC = "The failover chaos run on a real Patroni cluster (python -m tests.chaos failover)."


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["failover"]:
        return failover_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--jobs", type=int, default=20000)
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--minutes", type=float, default=None, help="chaos window (default 3)")
    window.add_argument("--seconds", type=float, default=None, help="chaos window, in seconds")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16, help="per worker process")
    parser.add_argument("--lease", type=float, default=1.5, help="lease seconds")
    parser.add_argument("--sweep", type=float, default=0.5, help="sweep interval seconds")
    parser.add_argument("--fault-gap", type=float, default=1.5, help="mean seconds between faults")
    parser.add_argument("--margin", type=float, default=1.0, help="scheduling allowance (s)")
    parser.add_argument(
        "--long-share", type=float, default=0.03, help="share of jobs working 2-5 s (> lease)"
    )
    parser.add_argument(
        "--strict-window",
        action="store_true",
        help="hold whole executions to the bound, time blocked in the fenced tx included",
    )
    parser.add_argument(
        "--no-capabilities",
        action="store_true",
        help="plain jobs only (no unique keys, limits, schedules, dependencies, batches, results)",
    )
    parser.add_argument(
        "--isolation",
        choices=("read committed", "repeatable read", "serializable"),
        default=None,
        help="the database's default_transaction_isolation for the run (default: the server's)",
    )
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep logs even when all is well")
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="where the run lives")
    parser.add_argument("--verbose", "-v", action="store_true", help="print faults as applied")
    parser.add_argument("--print-schedule", action="store_true", help="print it and exit")
    args = parser.parse_args(argv)

    seconds = args.seconds if args.seconds is not None else (args.minutes or 3.0) * 60
    config = ChaosConfig(
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
        jobs=args.jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        seconds=seconds,
        lease=args.lease,
        sweep=args.sweep,
        fault_gap=args.fault_gap,
        margin=args.margin,
        long_share=args.long_share,
        strict_window=args.strict_window,
        capabilities=not args.no_capabilities,
        isolation=args.isolation,
        drain_timeout=args.drain_timeout,
        keep=args.keep,
        base_dir=args.dir,
        verbose=args.verbose,
    )
    if args.print_schedule:
        schedule = config.schedule()
        print(f"seed {config.seed}: {len(schedule)} faults, fingerprint {fingerprint(schedule)}")
        for fault in schedule:
            print(f"  {fault.describe()}")
        return 0
    print(f"reproduce with: {config.command()}", flush=True)
    report = run_chaos(config, lambda line: print(line, flush=True))
    if not report.ok:
        failed = ", ".join(k for k, v in report.violations.items() if v)
        print(f"INVARIANTS VIOLATED with seed={config.seed}: {failed}", file=sys.stderr)
        print(f"reproduce with: {config.command()}", file=sys.stderr)
        return 1
    return 0


def failover_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos failover", description=FAILOVER_DOC.split("\n\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=5000, help="jobs enqueued in all")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--minutes", type=float, default=None, help="window (default 2)")
    window.add_argument("--seconds", type=float, default=None, help="window, in seconds")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sync", dest="sync", action="store_true", help="synchronous_mode")
    mode.add_argument("--async", dest="sync", action="store_false", help="asynchronous (default)")
    parser.add_argument("--strict", action="store_true", help="synchronous_mode_strict (--sync)")
    parser.add_argument("--nodes", type=int, default=2, help="PostgreSQL nodes (default 2)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--host-workers",
        type=int,
        default=0,
        help="workers on a host of their own (a network namespace, root) that partitions "
        "cut off from the primary",
    )
    parser.add_argument("--partition", type=float, default=12.0, help="partition seconds")
    parser.add_argument("--concurrency", type=int, default=8, help="per worker process")
    parser.add_argument("--lease", type=float, default=4.0, help="lease seconds")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true", help="keep logs even when all is well")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each failover")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.strict and not args.sync:
        parser.error("--strict needs --sync")
    if args.nodes < 2:
        parser.error("--nodes must be at least 2")
    seconds = args.seconds if args.seconds is not None else (args.minutes or 2.0) * 60
    config = FailoverConfig(
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
        jobs=args.jobs,
        seconds=seconds,
        synchronous=args.sync,
        strict=args.strict,
        nodes=args.nodes,
        workers=args.workers,
        host_workers=args.host_workers,
        partition=args.partition,
        concurrency=args.concurrency,
        lease=args.lease,
        drain_timeout=args.drain_timeout,
        keep=args.keep,
        verbose=args.verbose,
    )
    # The enqueuer's pool logs every failed reconnect while no primary is up: noise here.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    report = run_failover(config, lambda line: print(line, flush=True))
    if not report.ok:
        broken = ", ".join(name for name, items in report.violations.items() if items)
        print(
            f"failover: INVARIANTS VIOLATED ({broken}); replay: {config.command()}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
