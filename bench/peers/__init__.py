"""Peer queues for the drain comparison (``drain-pgqueuer*``, ``drain-procrastinate``).

The benchmark runs each peer in a subprocess of its own, ``python -P -m bench.peers PEER
setup|drain ...`` (see ``__main__``), so that a peer's imports, event loop and global
settings never mix with leaseq's or with the other peer's. ``setup`` installs the peer's
tables in the schema it is given and enqueues N no-op jobs the peer's fastest documented
way (untimed). ``drain`` runs the peer's own worker until the queue is empty and prints
one JSON line, ``{"processed": N, "seconds": S, ...}``: the time from just before the event
loop starts to just after the worker returned, measured inside the process (interpreter
start and imports left out, as in leaseq's own figure). The DSN comes in the environment
(``BENCH_PEER_DSN``), never in argv. The benchmark then checks the peer's own tables.

The peers are optional (``pip install -e '.[bench]'``). Their imports carry
``type: ignore[...,unused-ignore]`` so that mypy passes with or without them installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

DSN_ENV = "BENCH_PEER_DSN"
ENQUEUE_CHUNK = 5000  # jobs per bulk enqueue statement in setup (PREP_CHUNK in bench/db.py)


def parse(argv: Sequence[str] | None, prog: str, drivers: Sequence[str] = ()) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog)
    sub = p.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup", help="install the peer's tables and enqueue N no-op jobs")
    setup.add_argument("--schema", required=True)
    setup.add_argument("--jobs", type=int, required=True)
    drain = sub.add_parser("drain", help="drain the queue with the peer's own worker")
    drain.add_argument("--schema", required=True)
    drain.add_argument("--batch", type=int, required=True)
    drain.add_argument("--concurrency", type=int, required=True)
    if drivers:
        drain.add_argument("--driver", choices=drivers, default=drivers[0])
    return p.parse_args(argv)


def dsn() -> str:
    value = os.environ.get(DSN_ENV, "").strip()
    if not value:
        sys.exit(f"{DSN_ENV} is not set")
    return value


def report(processed: int, seconds: float, last_handler: float | None = None) -> None:
    """The drain's one line for the benchmark. ``last_handler``: seconds from the same start
    until the last handler returned (its completion not yet written, no shutdown)."""
    out: dict[str, float] = {"processed": processed, "seconds": seconds}
    if last_handler is not None:
        out["last_handler"] = last_handler
    print(json.dumps(out), flush=True)
