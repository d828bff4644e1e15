"""The failover chaos run on a real Patroni cluster, by hand:

    python tools/failover.py --jobs 20000 --seed 7 --minutes 10 --async

Starts etcd and two Patroni-managed PostgreSQL nodes, worker processes on the multi-host
DSN, and a seeded schedule of switchovers and hard failovers (kill -9 of the primary's
Patroni and postmaster), in asynchronous (default) or Patroni's synchronous mode. Prints one
line ``failover: jobs=… lost=… stale_success=… double_effects=… duplicates=… reappeared=…
failovers=…`` and exits 1 if an invariant broke. The harness and the exact definitions are
in tests/chaos/failover.py.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the harness lives in the test tree

from tests.chaos.failover import FailoverConfig, run_failover  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs enqueued in all")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--minutes", type=float, default=None, help="window (default 2)")
    window.add_argument("--seconds", type=float, default=None, help="window, in seconds")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sync", dest="sync", action="store_true", help="synchronous_mode")
    mode.add_argument("--async", dest="sync", action="store_false", help="asynchronous (default)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8, help="per worker process")
    parser.add_argument("--lease", type=float, default=4.0, help="lease seconds")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true", help="keep logs even when all is well")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each failover")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    seconds = args.seconds if args.seconds is not None else (args.minutes or 2.0) * 60
    config = FailoverConfig(
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
        jobs=args.jobs,
        seconds=seconds,
        synchronous=args.sync,
        workers=args.workers,
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
