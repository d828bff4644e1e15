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
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys

from tests.chaos.harness import ChaosConfig, fingerprint, run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    sys.exit(main())
