"""Job cost with real worker processes (docs/limits.md, "Job cost"): a worker killed with
SIGKILL while it holds a cost-3 job leaves its units held only until the sweep ends its
leases; then the whole capacity is available again, and a drain after it never holds more
units than the limit. The boundary is the kill; the invariant is the units."""

from __future__ import annotations

import pathlib
import signal
import threading
import time

import psycopg
import pytest

import leaseq
from tests.support.helpers import rows
from tests.support.procs import WorkerProcess, wait_for

pytestmark = pytest.mark.slow  # real worker processes, killed

FAST = ("--poll-interval", "0.05", "--sweep-interval", "0.2")


def _units(dsn: str, schema: str, name: str) -> int:
    found = rows(dsn, "SELECT count(*) FROM {s}.held_slots WHERE limit_name = %s", schema, name)
    return int(found[0][0])


def _count(dsn: str, schema: str, where: str) -> int:
    ((n,),) = rows(dsn, f"SELECT count(*) FROM {{s}}.jobs WHERE {where}", schema)
    return int(n)


class UnitSampler:
    """Every 10 ms, on its own connection: the units held of one limit (one statement)."""

    def __init__(self, dsn: str, schema: str, name: str) -> None:
        self.dsn, self.schema, self.name = dsn, schema, name
        self.seen: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    f"SELECT count(*) FROM {self.schema}.held_slots WHERE limit_name = %s",
                    (self.name,),
                ).fetchone()
                assert row is not None
                self.seen.append(int(row[0]))
                time.sleep(0.01)

    def __enter__(self) -> UnitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("limit", ["key:gpu", "queue:lim"])
def test_kill_9_worker_holding_a_cost_3_job_sweep_frees_every_unit(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, limit: str
) -> None:
    client.set_limit(limit, concurrency=4)
    marker = tmp_path / "ticks"
    ticker = {"marker": str(marker), "seconds": 60, "later": 0}
    big = int(client.enqueue("ticker", ticker, queue="lim", limit_key="gpu", cost=3))
    small = int(client.enqueue("ticker", ticker, queue="lim", limit_key="gpu"))
    # Held back: 3 more units do not fit beside the 4 taken.
    client.enqueue("noop", None, queue="lim", limit_key="gpu", cost=3)
    args = ("--queue", "lim", "--any-queue", "--lease-seconds", "1", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, "--poll-interval", "0.05", log_dir=tmp_path) as k:
        wait_for(lambda: _units(dsn, schema, limit) == 4, 30, "the worker to take 4 units")
        per_job = rows(
            dsn,
            "SELECT job_id, count(*) FROM {s}.held_slots WHERE limit_name = %s GROUP BY 1",
            schema,
            limit,
        )
        assert {int(r[0]): int(r[1]) for r in per_job} == {big: 3, small: 1}
        assert _count(dsn, schema, "status = 'pending' AND attempt_count = 0") == 1
        k.signal(signal.SIGKILL)
        k.wait(10)
    # Its leases run out; until a sweep ends them, their units stay held.
    wait_for(
        lambda: _count(dsn, schema, "status = 'running' AND lease_expires_at <= now()") == 2,
        10,
        "the killed worker's leases to expire",
    )
    assert _units(dsn, schema, limit) == 4
    client.sweep()
    assert rows(dsn, "SELECT count(*) FROM {s}.held_slots", schema)[0][0] == 0
    # The whole capacity is back: a drain runs the three (4 + 3 units wanted, 4 at most).
    with (
        UnitSampler(dsn, schema, limit) as sampler,
        WorkerProcess(
            dsn, schema, "--queue", "lim", "--any-queue", "--drain", *FAST, log_dir=tmp_path
        ) as w,
    ):
        assert w.wait(90) == 0, w.output()[-2000:]
    assert _count(dsn, schema, "status = 'succeeded'") == 3
    assert sampler.seen and max(sampler.seen) <= 4
    assert rows(dsn, "SELECT count(*) FROM {s}.held_slots", schema)[0][0] == 0
