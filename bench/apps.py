"""The app the benchmark's worker subprocesses load (``bench.apps:app``).

``noop`` does nothing, so the drains measure the queue's own cost per job; ``noop_sync`` is
the same as a plain ``def`` handler, which the worker runs on its pool threads (what most
Python code is: Django, requests, SDKs). ``io_wait`` awaits 10 ms (``asyncio.sleep``): an
I/O-bound handler, the ``workload-io`` scenario's. ``stamp`` is
the wake-latency probe: it records the wall-clock time at which its handler started.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import leaseq

app = leaseq.App()

_signal_socket: socket.socket | None = None


@app.task(name="noop")
async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
    pass


IO_SECONDS = 0.010  # what io_wait awaits


@app.task(name="io_wait")
async def io_wait(ctx: leaseq.JobContext, payload: Any) -> None:
    await asyncio.sleep(IO_SECONDS)


@app.task(name="noop_sync")
def noop_sync(ctx: leaseq.JobContext, payload: Any) -> None:
    pass


@app.task(name="stamp")
async def stamp(ctx: leaseq.JobContext, payload: Any) -> None:
    """Payload ``{"i": N, "file": PATH, "port": PORT}``: append ``"N <time.time()>"`` to
    PATH (the figure), then send ``N`` in a UDP datagram to 127.0.0.1:PORT, which tells
    the benchmark it may enqueue the next job."""
    started = time.time()  # first thing: this is the moment being measured
    global _signal_socket
    with open(payload["file"], "a", encoding="utf-8") as out:
        out.write(f"{int(payload['i'])} {started!r}\n")
    if _signal_socket is None:
        _signal_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _signal_socket.sendto(str(int(payload["i"])).encode(), ("127.0.0.1", int(payload["port"])))
