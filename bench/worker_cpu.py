"""The worker's CPU per no-op job at several commits, side by side (interleaved rounds).

    .venv/bin/python -m bench.worker_cpu COMMIT[,COMMIT...] [--dsn DSN] [--jobs 100000]
                                         [--rounds 4]

Each commit runs from its own tree (``git archive`` into a temporary folder, put first on
``PYTHONPATH``; the installed dependencies are this checkout's): a fresh schema migrated by
that commit's code and filled with ``--jobs`` no-op jobs (untimed), then its ``leaseq worker
bench.apps:app --burst --concurrency 200 --batch-size 100``. The figure is the worker's user +
system CPU (``wait4``) per job, less the same worker's run on an empty schema (its start-up,
imports and connections), so what a job costs and not what starting costs. Rounds alternate
the order of the commits. Use it to find what a change costs a job (the regression check of
the plain drain compares whole drains; this isolates the worker's share).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.db import connect, drop_schema, new_schema_name
from bench.harness import REPO_ROOT, resolve_bench_dsn

FILL = """
import sys, leaseq
client = leaseq.Client(sys.argv[1], schema=sys.argv[2])
client.migrate()
n = int(sys.argv[3])
for start in range(0, n, 20000):
    client.enqueue_many({"task": "noop", "payload": {}} for _ in range(min(20000, n - start)))
client.close()
"""
WORKER_TIMEOUT = 600.0


def _tree(commit: str, into: Path) -> Path:
    folder = into / commit
    if not folder.is_dir():
        folder.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", commit], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def _cpu(dsn: str, tree: Path, jobs: int) -> float:
    """Seconds of worker CPU to drain ``jobs`` no-op jobs (0: an empty schema)."""
    schema = new_schema_name("worker-cpu")
    env = {**os.environ, "PYTHONPATH": str(tree), "LEASEQ_DSN": dsn, "LEASEQ_SCHEMA": schema}
    try:
        subprocess.run(
            [sys.executable, "-c", FILL, dsn, schema, str(jobs)], env=env, cwd=tree, check=True
        )
        with connect(dsn) as conn:  # autocommit
            conn.execute("CHECKPOINT")
        command = [sys.executable, "-P", "-m", "leaseq", "worker", "bench.apps:app", "--burst"]
        command += ["--concurrency", "200", "--batch-size", "100"]
        worker = subprocess.Popen(
            command, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + WORKER_TIMEOUT
        while True:
            pid, status, usage = os.wait4(worker.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                worker.kill()
                raise SystemExit(f"bench.worker_cpu: the worker of {tree.name} did not end")
            time.sleep(0.02)
        if status != 0:
            err = worker.stderr.read().decode() if worker.stderr else ""
            raise SystemExit(f"bench.worker_cpu: the worker of {tree.name} failed: {err[-500:]}")
        return usage.ru_utime + usage.ru_stime
    finally:
        drop_schema(dsn, schema)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_cpu")
    parser.add_argument("commits", help="commits to compare, comma-separated")
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    dsn = resolve_bench_dsn(args.dsn)
    commits = [c.strip() for c in args.commits.split(",") if c.strip()]
    found: dict[str, list[float]] = {c: [] for c in commits}
    with tempfile.TemporaryDirectory(prefix="leaseq-worker-cpu-") as scratch:
        trees = {c: _tree(c, Path(scratch)) for c in commits}
        for r in range(args.rounds):
            for commit in commits if r % 2 == 0 else commits[::-1]:
                empty = _cpu(dsn, trees[commit], 0)
                full = _cpu(dsn, trees[commit], args.jobs)
                net = (full - empty) / args.jobs * 1e6
                found[commit].append(net)
                print(
                    f"round {r + 1} {commit}: {net:.2f} us/job net of start-up "
                    f"({full / args.jobs * 1e6:.2f} gross, start-up {empty:.2f} s)",
                    flush=True,
                )
    first = statistics.median(found[commits[0]])
    for commit in commits:
        med = statistics.median(found[commit])
        print(
            f"{commit}: {med:.2f} us/job ({min(found[commit]):.2f}-{max(found[commit]):.2f}), "
            f"{med / first:.3f} of {commits[0]}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
