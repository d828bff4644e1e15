"""What a drain costs, measured while it runs (the ``scale-*`` scenarios): CPU per process
(the worker tree through psutil, and PostgreSQL's backends that serve it), lock waits
(``pg_stat_activity`` sampled every 50 ms), WAL and statements per job
(``pg_stat_statements`` when the server preloads it; else WAL from ``pg_stat_wal``, which
counts the whole server).

A backend counts as the drain's when its current or last statement names the drain's
schema (every leaseq statement is schema-qualified), so other sessions on a shared server
are left out of the CPU and wait figures. A backend's CPU is the last value seen before it
exited (within one sampling interval).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench.db import connect

INTERVAL = 0.05  # seconds between samples

# One row whatever is running: the database's clock, and the drain's client backends
# (autovacuum's workers name the schema too, but they are not the drain's).
ACTIVITY = """
SELECT extract(epoch FROM clock_timestamp())::float8,
       coalesce(json_agg(json_build_array(
           pid, state, coalesce(wait_event_type, ''), coalesce(wait_event, ''))), '[]')
FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'
  AND position(%(schema)s in query) > 0
"""
STATEMENTS = """
SELECT coalesce(sum(calls), 0)::float8, coalesce(sum(wal_bytes), 0)::float8,
       coalesce(sum(wal_records), 0)::float8
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND position(%(schema)s in query) > 0
"""
SERVER_WAL = "SELECT wal_bytes::float8, wal_records::float8 FROM pg_stat_wal"


def has_pg_stat_statements(dsn: str) -> bool:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
        ).fetchone()
        if not row or not row[0]:
            return False
        try:
            conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        except Exception:  # not preloaded: the view refuses to be read
            return False
    return True


@dataclass
class ProbeResult:
    worker_cpu: dict[int, float] = field(default_factory=dict)  # pid -> user+sys seconds
    backend_cpu: dict[int, float] = field(default_factory=dict)
    waits: collections.Counter[str] = field(default_factory=collections.Counter)
    active_samples: int = 0  # (backend, sample) pairs in state 'active'
    samples: int = 0
    statements: float | None = None  # pg_stat_statements calls of this schema
    wal_bytes: float = 0.0
    wal_records: float = 0.0
    wal_source: str = "pg_stat_wal (whole server)"
    #: Per sample: (database clock, epoch s; worker tree CPU s; backends' CPU s so far).
    timeline: list[tuple[float, float, float]] = field(default_factory=list)

    def cpu_between(self, start: float, end: float) -> tuple[float, float]:
        """(worker, backends) CPU seconds spent between two database-clock instants (the
        drain's first claim and last completion): start-up and shutdown left out."""

        def at(t: float) -> tuple[float, float]:
            seen = [(w, b) for ts, w, b in self.timeline if ts <= t]
            return seen[-1] if seen else (0.0, 0.0)

        (w0, b0), (w1, b1) = at(start), at(end)
        return max(0.0, w1 - w0), max(0.0, b1 - b0)

    def share(self, *prefixes: str) -> float:
        """Percent of the active backend samples whose wait starts with one of prefixes
        ("" for none: running on CPU or ready to)."""
        if not self.active_samples:
            return 0.0
        hits = sum(
            n
            for k, n in self.waits.items()
            if any(k == p or (p and k.startswith(p)) for p in prefixes)
        )
        return 100.0 * hits / self.active_samples


class Probe:
    """Samples a drain's worker tree and backends in a thread from ``start`` to ``stop``."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.result = ProbeResult()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._statements = has_pg_stat_statements(dsn)
        self._before = self._counters()

    def _counters(self) -> tuple[float, float, float]:
        """(statements, WAL bytes, WAL records) so far: this schema's, or the server's."""
        with connect(self.dsn) as conn:
            if self._statements:
                row = conn.execute(STATEMENTS, {"schema": self.schema}).fetchone()
            else:
                wal = conn.execute(SERVER_WAL).fetchone()
                row = None if wal is None else (0.0, *wal)
        return (float(row[0]), float(row[1]), float(row[2])) if row else (0.0, 0.0, 0.0)

    def start(self, root_pid: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(root_pid,), daemon=True)
        self._thread.start()

    def _run(self, root_pid: int) -> None:
        res = self.result
        with connect(self.dsn) as conn:
            root = psutil.Process(root_pid)
            while not self._stop.wait(INTERVAL):
                try:
                    tree = [root, *root.children(recursive=True)]
                except psutil.Error:
                    tree = []
                for proc in tree:
                    try:
                        t = proc.cpu_times()
                    except psutil.Error:
                        continue
                    res.worker_cpu[proc.pid] = t.user + t.system
                row = conn.execute(ACTIVITY, {"schema": self.schema}).fetchone()
                if row is None:
                    continue
                now, backends = float(row[0]), row[1]
                res.samples += 1
                for pid, state, wtype, wevent in backends:
                    if state == "active":
                        res.active_samples += 1
                        res.waits[f"{wtype}:{wevent}" if wtype else ""] += 1
                    try:
                        t = psutil.Process(pid).cpu_times()
                        res.backend_cpu[pid] = t.user + t.system
                    except psutil.Error:
                        pass
                # Sums over every process seen so far, with the last value of those that
                # exited: a --burst worker process that finds no more work exits before the
                # others, and a sum over the live ones only would drop.
                res.timeline.append(
                    (now, sum(res.worker_cpu.values()), sum(res.backend_cpu.values()))
                )

    def stop(self) -> ProbeResult:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        res = self.result
        after = self._counters()
        calls, res.wal_bytes, res.wal_records = (
            a - b for a, b in zip(after, self._before, strict=True)
        )
        if self._statements:
            res.statements = calls
            res.wal_source = "pg_stat_statements (this schema)"
        return res


def summary(res: ProbeResult) -> dict[str, Any]:
    """For the JSON file and the notes: the top wait events, the processes seen."""
    top = res.waits.most_common(6)
    return {
        "active_samples": res.active_samples,
        "samples": res.samples,
        "waits": {
            (k or "none (CPU)"): round(100.0 * n / max(1, res.active_samples), 1) for k, n in top
        },
        "worker_processes": len(res.worker_cpu),
        "backends": len(res.backend_cpu),
        "wal_source": res.wal_source,
    }
