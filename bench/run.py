"""``python -m bench``: the command line of the side-by-side benchmark, leaseq against
the raw-SQL limit, all in one run.

Every scenario runs ``--repeat`` times; the repeats are interleaved (round 1 of every
scenario, then round 2, ...) so that drift of the machine hits all scenarios alike. Each
sample gets a fresh schema, made with ``leaseq.Client(dsn, schema=...).migrate()`` and
dropped afterwards. Most figures are rates (jobs, claims or leases per second); some are
latencies (ms) or durations (s). Each is printed as the median and min-max over the
repeats. Ratios pair the samples of the same round and report the median and min-max of
those per-round ratios.

This prints figures and asserts nothing about time. It does check that each scenario
really did its work (every job drained, every lease swept, every old row pruned), since a
figure for work that was not done would be meaningless.

The parts: ``bench.harness`` (settings, samples, worker processes, rounds, ratios),
``bench.db`` (schemas, seeding, raw-SQL baselines), ``bench.report`` (tables, JSON),
``bench.scenarios.*`` (one module per scenario), ``bench.catalog`` (their order).

Usage: ``python -m bench [--dsn DSN] [--jobs N] [--batch B] [--repeat R] [--only NAME]``;
see bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from collections.abc import Sequence

from bench.catalog import (
    SCENARIOS,
    build_ratios,
    build_scenarios,
    explain_file,
    extra_results,
    header_lines,
    notes,
    peers,
    save_reference,
    summary_markdown,
)
from bench.db import may_checkpoint, server_info
from bench.harness import (
    DEFAULT_BACKLOGS,
    DEFAULT_OUT,
    DEFAULT_PEER_JOBS,
    BenchError,
    Sample,
    Scenario,
    Series,
    Settings,
    resolve_bench_dsn,
    run_rounds,
    select_scenarios,
)
from bench.report import progress, render, results_json


def parse_backlogs(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(x.replace("_", "")) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of sizes: {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("backlog sizes must be at least 1")
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = ", ".join(s.name for s in SCENARIOS)
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="leaseq against the raw-SQL limit, measured in one run. "
        "Prints each figure (median and min-max over the repeats) and ratios.",
    )
    p.add_argument(
        "--dsn",
        default=None,
        help="PostgreSQL DSN (default: env LEASEQ_DSN, else leaseq's embedded server)",
    )
    p.add_argument(
        "--jobs",
        "-n",
        type=int,
        default=20000,
        help="jobs per drain / bulk enqueue; pending jobs claimed in claim-under-prune",
    )
    p.add_argument("--batch", "-b", type=int, default=100, help="claim batch size")
    p.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=None,
        help="worker concurrency (default: 2 x --batch, so claims overlap completions)",
    )
    p.add_argument("--single", "-m", type=int, default=5000, help="single-row enqueues per sample")
    p.add_argument("--repeat", "-r", type=int, default=3, help="samples per scenario")
    p.add_argument(
        "--prune-old",
        type=int,
        default=200_000,
        help="claim-under-prune: old succeeded jobs in the table (all pruned)",
    )
    p.add_argument(
        "--claims",
        type=int,
        default=2000,
        help="claim-vs-backlog: timed claim+complete round trips per backlog size",
    )
    p.add_argument(
        "--backlogs",
        type=parse_backlogs,
        default=DEFAULT_BACKLOGS,
        metavar="N,N,...",
        help="claim-vs-backlog: pending backlog sizes (default: 10000,100000,1000000)",
    )
    p.add_argument(
        "--expired", type=int, default=100_000, help="sweep-recovery: expired leases to sweep"
    )
    p.add_argument(
        "--wake-jobs", type=int, default=200, help="wake-latency: timed jobs per variant"
    )
    p.add_argument(
        "--peer-jobs",
        type=int,
        default=DEFAULT_PEER_JOBS,
        help=f"drain-procrastinate: jobs per drain (default {DEFAULT_PEER_JOBS}; "
        "procrastinate drains a few hundred jobs/s, so --jobs would take minutes)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these scenarios (repeatable, comma-separated, globs ok): {names}",
    )
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help="JSON results file (default: bench/results/latest.json); the claim-vs-backlog "
        "EXPLAIN goes to the same directory",
    )
    p.add_argument(
        "--save-reference",
        action="store_true",
        help="write this run's plain-drain figures to bench/reference/drain.json, the "
        "reference later runs are compared with (needs drain-raw and drain-leaseq)",
    )
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = p.parse_args(argv)
    for name in (
        "jobs",
        "batch",
        "single",
        "repeat",
        "prune_old",
        "claims",
        "expired",
        "peer_jobs",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.wake_jobs < 2:
        p.error("--wake-jobs must be at least 2")
    if args.concurrency is not None and args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    all_scenarios = build_scenarios(args.backlogs)
    ratios = build_ratios(args.backlogs)
    if args.list:
        for s in all_scenarios:
            print(f"{s.name:24}  {'' if s.default else '(opt-in) '}{s.description}")
        return 0
    scenarios = select_scenarios(args.only, all_scenarios)
    out: pathlib.Path = args.out
    settings = Settings(
        dsn=resolve_bench_dsn(args.dsn),
        jobs=args.jobs,
        batch=args.batch,
        concurrency=args.concurrency or 2 * args.batch,
        single=args.single,
        repeat=args.repeat,
        prune_old=args.prune_old,
        wake_jobs=args.wake_jobs,
        expired=args.expired,
        claims=args.claims,
        backlogs=args.backlogs,
        peer_jobs=args.peer_jobs,
        results_dir=out.parent,
    )
    settings = dataclasses.replace(settings, checkpoint=may_checkpoint(settings.dsn))
    info = server_info(settings.dsn)
    series = {m.key: Series(m) for s in scenarios for m in s.metrics}

    def report_sample(round_no: int, scenario: Scenario, samples: dict[str, Sample]) -> None:
        parts = [progress(key, s, series[key].metric.unit) for key, s in samples.items()]
        print(
            f"[{round_no}/{settings.repeat}] {scenario.name}: " + ", ".join(parts),
            file=sys.stderr,
            flush=True,
        )

    try:
        unavailable = run_rounds(scenarios, settings, series, report_sample)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    header, tail = header_lines(series, settings), notes(series, settings)
    print(render(series, settings, info, ratios, unavailable, header, tail))
    table = summary_markdown(series, settings, info)
    if table:
        print("\n" + table)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = results_json(
        series, settings, info, ratios, unavailable, peers(settings), explain_file(series, settings)
    )
    results.update(extra_results(series))
    results["summary_markdown"] = table
    results["summary_markdown_compact"] = summary_markdown(series, settings, info, compact=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {out}")
    if args.save_reference:
        try:
            path = save_reference(series, results)
        except BenchError as exc:
            print(f"bench: error: {exc}", file=sys.stderr)
            return 1
        print(f"reference: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
