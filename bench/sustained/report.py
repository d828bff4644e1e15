"""The sustained run's output: the progress line per sample, the interval table, the
decay summary, the header and the JSON results file (the thirds and the size marks come
from ``trend``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.harness import percentile
from bench.report import environment, server_line, table
from bench.sustained.model import Interval, Options
from bench.sustained.sampling import TICK
from bench.sustained.trend import flatness, flatnesstable, sizes_at, sizestable
from bench.sustained.workers import Worker

MB = 1024 * 1024


@dataclass
class Run:
    """What a run leaves behind, also when it is interrupted half-way."""

    intervals: list[Interval] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    interrupted: bool = False


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def progress_line(iv: Interval) -> str:
    behind = f"  PRODUCER BEHIND by {iv.producer_behind:,} jobs" if iv.producer_behind else ""
    t = iv.table
    return (
        f"[{iv.t:5.0f}s] offered {iv.offered_per_s:,.0f}/s  finished {iv.finished_per_s:,.0f}/s"
        f"  backlog {iv.backlog:,} (oldest {iv.oldest_age:.1f}s)"
        f"  table {t.table_bytes / MB:.1f} MB  index {t.index_bytes / MB:.1f} MB"
        f"  toast {t.toast_bytes / MB:.1f} MB"
        f"  live {t.live_tuples:,}  dead {t.dead_tuples:,}  autovacuums {t.autovacuums}"
        f"  pruned {iv.pruned_per_s:,.0f}/s (busy {_pct(iv.prune_busy)} %,"
        f" {_ms(iv.prune_ms_mean)} ms/batch)"
        f"  claim p50/p99 {_ms(iv.claim_p50_ms)}/{_ms(iv.claim_p99_ms)} ms"
        f"  RSS {iv.rss_bytes / MB:.0f} MB{behind}"
    )


def summarize(intervals: Sequence[Interval]) -> dict[str, Any]:
    """The decay figures: the first interval is the warm-up (the worker's pool filling,
    the table empty); the steady state is every interval after it. Its first and last
    intervals are compared, and sizes at its start (the end of the warm-up) and its end."""
    if len(intervals) < 2:
        return {"note": "fewer than 2 intervals: no steady state after the warm-up"}
    warm, steady = intervals[0], intervals[1:]
    first, last = steady[0], steady[-1]
    seconds = sum(iv.seconds for iv in steady)
    rates = [iv.finished_per_s for iv in steady]
    return {
        "warmup_seconds": warm.seconds,
        "steady_seconds": seconds,
        "offered_per_s": sum(iv.offered for iv in steady) / seconds,
        "finished_per_s": sum(iv.finished for iv in steady) / seconds,
        "finished_per_s_median": percentile(rates, 50),
        "finished_per_s_min": min(rates),
        "finished_per_s_max": max(rates),
        "finished_per_s_first": first.finished_per_s,
        "finished_per_s_last": last.finished_per_s,
        "throughput_last_over_first": last.finished_per_s / first.finished_per_s
        if first.finished_per_s
        else None,
        "backlog_start": warm.backlog,
        "backlog_end": last.backlog,
        "backlog_max": max(iv.backlog for iv in steady),
        "oldest_age_max": max(iv.oldest_age for iv in steady),
        "table_bytes_start": warm.table.table_bytes,
        "table_bytes_end": last.table.table_bytes,
        "index_bytes_start": warm.table.index_bytes,
        "index_bytes_end": last.table.index_bytes,
        "toast_bytes_start": warm.table.toast_bytes,
        "toast_bytes_end": last.table.toast_bytes,
        "live_tuples_start": warm.table.live_tuples,
        "live_tuples_end": last.table.live_tuples,
        "dead_tuples_max": max(iv.table.dead_tuples for iv in intervals),
        "autovacuums": last.table.autovacuums,
        "autovacuums_steady": last.table.autovacuums - warm.table.autovacuums,
        "deleted_tuples": last.table.deleted_tuples,
        "claim_p99_ms_first": first.claim_p99_ms,
        "claim_p99_ms_last": last.claim_p99_ms,
        "rss_bytes_start": warm.rss_bytes,
        "rss_bytes_end": last.rss_bytes,
        "producer_behind_max": max(iv.producer_behind for iv in intervals),
    }


def intervaltable(intervals: Sequence[Interval]) -> str:
    headers = [
        "time s",
        "offered/s",
        "finished/s",
        "backlog",
        "oldest s",
        "table MB",
        "index MB",
        "toast MB",
        "live rows",
        "dead tuples",
        "autovacuums",
        "pruned/s",
        "prune busy %",
        "ms/batch",
        "claim p50 ms",
        "claim p99 ms",
        "RSS MB",
    ]
    rows = [
        [
            f"{iv.t:.0f}",
            f"{iv.offered_per_s:,.0f}",
            f"{iv.finished_per_s:,.0f}",
            f"{iv.backlog:,}",
            f"{iv.oldest_age:.1f}",
            f"{iv.table.table_bytes / MB:.1f}",
            f"{iv.table.index_bytes / MB:.1f}",
            f"{iv.table.toast_bytes / MB:.1f}",
            f"{iv.table.live_tuples:,}",
            f"{iv.table.dead_tuples:,}",
            str(iv.table.autovacuums),
            f"{iv.pruned_per_s:,.0f}",
            _pct(iv.prune_busy),
            _ms(iv.prune_ms_mean),
            _ms(iv.claim_p50_ms),
            _ms(iv.claim_p99_ms),
            f"{iv.rss_bytes / MB:.0f}",
        ]
        for iv in intervals
    ]
    return table(headers, rows, right=set(range(len(headers))))


def _mb(n: int) -> str:
    return f"{n / MB:.1f} MB"


def summarytable(s: dict[str, Any]) -> str:
    if "note" in s:
        return str(s["note"])
    ratio = s["throughput_last_over_first"]
    rows = [
        [
            "finished/s, first / last steady interval",
            f"{s['finished_per_s_first']:,.0f} / {s['finished_per_s_last']:,.0f}",
        ],
        [
            "throughput ratio, last / first (no decay: ~1.00)",
            "-" if ratio is None else f"{ratio:.2f}",
        ],
        [
            "finished/s over the steady state: mean (min-max)",
            f"{s['finished_per_s']:,.0f} ({s['finished_per_s_min']:,.0f}-"
            f"{s['finished_per_s_max']:,.0f})",
        ],
        ["offered/s over the steady state", f"{s['offered_per_s']:,.0f}"],
        [
            "backlog, start -> end of steady state (max)",
            f"{s['backlog_start']:,} -> {s['backlog_end']:,} ({s['backlog_max']:,})",
        ],
        ["oldest claimable job, max", f"{s['oldest_age_max']:.1f} s"],
        [
            "table size, start -> end",
            f"{_mb(s['table_bytes_start'])} -> {_mb(s['table_bytes_end'])}",
        ],
        [
            "index size, start -> end",
            f"{_mb(s['index_bytes_start'])} -> {_mb(s['index_bytes_end'])}",
        ],
        [
            "TOAST size (heap and index), start -> end",
            f"{_mb(s['toast_bytes_start'])} -> {_mb(s['toast_bytes_end'])}",
        ],
        ["live rows, start -> end", f"{s['live_tuples_start']:,} -> {s['live_tuples_end']:,}"],
        ["rows deleted (pruned) in the whole run", f"{s['deleted_tuples']:,}"],
        ["dead tuples, max", f"{s['dead_tuples_max']:,}"],
        [
            "autovacuum runs (in the steady state)",
            f"{s['autovacuums']} ({s['autovacuums_steady']})",
        ],
        [
            "claim statement p99, first -> last",
            f"{_ms(s['claim_p99_ms_first'])} -> {_ms(s['claim_p99_ms_last'])} ms",
        ],
        ["worker RSS, start -> end", f"{_mb(s['rss_bytes_start'])} -> {_mb(s['rss_bytes_end'])}"],
    ]
    if s["producer_behind_max"]:
        rows.append(["producer behind schedule, max", f"{s['producer_behind_max']:,} jobs"])
    return table(["summary (after a warm-up interval)", "value"], rows, right={1})


def header(opts: Options, info: dict[str, Any]) -> str:
    return (
        server_line("sustained", opts.dsn, info) + "\n"
        f"minutes={opts.minutes:g} rate={opts.rate:g}/s interval={opts.interval:g}s "
        f"retention={opts.retention} prune-interval={opts.prune_interval} "
        f"concurrency={opts.concurrency} batch={opts.batch} "
        f"workers={opts.workers}"
        + (f" payload-bytes={opts.payload_bytes}" if opts.payload_bytes else "")
        + (f" offload-above={opts.offload_above}" if opts.offload_above else "")
        + (" own-server" if opts.own_server else "")
    )


def results_json(opts: Options, info: dict[str, Any], run: Run) -> dict[str, Any]:
    return {
        **environment(opts.dsn, info, from_repo=False),
        "settings": {
            "minutes": opts.minutes,
            "rate": opts.rate,
            "interval": opts.interval,
            "retention": opts.retention,
            "prune_interval": opts.prune_interval,
            "concurrency": opts.concurrency,
            "batch": opts.batch,
            "workers": opts.workers,
            "own_server": opts.own_server,
            "payload_bytes": opts.payload_bytes,
            "offload_above": opts.offload_above,
            "tick": TICK,
        },
        "interrupted": run.interrupted,
        "worker_exit_codes": [w.exit_code for w in run.workers],
        "intervals": [dataclasses.asdict(iv) for iv in run.intervals],
        "summary": summarize(run.intervals),
        "flatness": flatness(run.intervals),
        "sizes_at": sizes_at(run.intervals) if run.intervals else {},
    }


def report(opts: Options, info: dict[str, Any], run: Run) -> None:
    """The table and the summary on stdout (progress went to stderr), and the JSON file."""
    print(header(opts, info))
    if run.interrupted:
        print(f"interrupted after {run.intervals[-1].t:.0f} s: the figures cover that part")
    print()
    print(intervaltable(run.intervals))
    print()
    print(summarytable(summarize(run.intervals)))
    print()
    print(flatnesstable(flatness(run.intervals)))
    print()
    print(sizestable(run.intervals))
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(results_json(opts, info, run), indent=2) + "\n")
    print(f"\nresults: {opts.out}")
