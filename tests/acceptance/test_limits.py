"""Limits with real worker processes: a sampler watching the running jobs never sees more
than the limit; a killed worker's slots come back with the sweep that ends its leases; a
frozen worker, resumed, frees and completes nothing. Each test names the boundary it breaks."""

from __future__ import annotations

import pathlib
import signal
import threading
import time

import psycopg
import pytest

import leaseq
from leaseq import RateLimit
from tests.support.helpers import rows
from tests.support.procs import WorkerProcess, wait_for

pytestmark = pytest.mark.slow  # real worker processes, signalled and killed

QUICK_RETRY = leaseq.RetryPolicy(base=0.01, cap=0.05)
FAST = ("--poll-interval", "0.05", "--sweep-interval", "0.2")


class Sampler:
    """Every 20 ms: running jobs (overall and by limit key) and slots held, on its own
    connection, until stopped."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.running: list[int] = []
        self.per_key: list[int] = []
        self.slots: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        s = self.schema
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    f"SELECT (SELECT count(*) FROM {s}.jobs WHERE status = 'running'),"
                    f" (SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {s}.jobs"
                    f"   WHERE status = 'running' GROUP BY limit_key) AS k),"
                    f" (SELECT count(*) FROM {s}.held_slots)"
                ).fetchone()
                assert row is not None
                self.running.append(int(row[0]))
                self.per_key.append(int(row[1]))
                self.slots.append(int(row[2]))
                time.sleep(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _count(dsn: str, schema: str, where: str) -> int:
    ((n,),) = rows(dsn, f"SELECT count(*) FROM {{s}}.jobs WHERE {where}", schema)
    return int(n)


def _slot_rows(dsn: str, schema: str) -> list[tuple[int, int]]:
    found = rows(dsn, "SELECT job_id, lease_token FROM {s}.held_slots ORDER BY 1", schema)
    return [(r[0], r[1]) for r in found]


@pytest.mark.parametrize("limit", [1, 3])
def test_four_workers_never_run_more_than_the_queue_limit(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, limit: int
) -> None:
    client.set_limit("queue:lim", concurrency=limit)
    client.enqueue_many(
        [{"task": "sleepy", "payload": {"seconds": 0.002}, "queue": "lim"} for _ in range(500)]
    )
    args = ("--queue", "lim", "--any-queue", "--concurrency", "10", "--drain", *FAST)
    with Sampler(dsn, schema) as sampler:
        workers = [WorkerProcess(dsn, schema, *args, log_dir=tmp_path) for _ in range(4)]
        try:
            for w in workers:
                assert w.wait(240) == 0, w.output()[-2000:]
        finally:
            for w in workers:
                w.kill()
    assert _count(dsn, schema, "status = 'succeeded'") == 500
    assert len(sampler.running) > 10
    assert max(sampler.running) <= limit
    assert max(sampler.slots) <= limit
    assert _slot_rows(dsn, schema) == []


def test_per_key_limit_holds_each_key_and_lets_other_keys_run(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    client.set_limit("key:cust:*", concurrency=1)
    client.enqueue_many(
        [
            {
                "task": "sleepy",
                "payload": {"seconds": 0.02},
                "queue": "lim",
                "limit_key": f"cust:{i % 5}",
            }
            for i in range(100)
        ]
    )
    args = ("--queue", "lim", "--any-queue", "--concurrency", "10", "--drain", *FAST)
    with Sampler(dsn, schema) as sampler:
        workers = [WorkerProcess(dsn, schema, *args, log_dir=tmp_path) for _ in range(2)]
        try:
            for w in workers:
                assert w.wait(240) == 0, w.output()[-2000:]
        finally:
            for w in workers:
                w.kill()
    assert _count(dsn, schema, "status = 'succeeded'") == 100
    assert max(sampler.per_key) <= 1
    assert max(sampler.running) > 1  # other keys ran beside a held one
    assert _slot_rows(dsn, schema) == []


def test_kill_9_worker_holding_slots_sweep_frees_them(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    client.set_limit("queue:lim", concurrency=2)
    marker = tmp_path / "ticks"
    for _ in range(2):
        client.enqueue("ticker", {"marker": str(marker), "seconds": 60, "later": 0}, queue="lim")
    client.enqueue("noop", None, queue="lim")  # held back by the limit
    args = ("--queue", "lim", "--any-queue", "--lease-seconds", "1", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, "--poll-interval", "0.05", log_dir=tmp_path) as k:
        wait_for(lambda: len(_slot_rows(dsn, schema)) == 2, 30, "the worker to take 2 slots")
        assert _count(dsn, schema, "status = 'pending' AND attempt_count = 0") == 1
        k.signal(signal.SIGKILL)
        k.wait(10)
    # Its leases run out; until a sweep ends them, their slots stay held.
    wait_for(
        lambda: _count(dsn, schema, "status = 'running' AND lease_expires_at <= now()") == 2,
        10,
        "the killed worker's leases to expire",
    )
    assert len(_slot_rows(dsn, schema)) == 2
    client.sweep()
    assert _slot_rows(dsn, schema) == []
    with (
        Sampler(dsn, schema) as sampler,
        WorkerProcess(
            dsn, schema, "--queue", "lim", "--any-queue", "--drain", *FAST, log_dir=tmp_path
        ) as w,
    ):
        assert w.wait(60) == 0, w.output()[-2000:]
    assert _count(dsn, schema, "status = 'succeeded'") == 3
    assert max(sampler.running) <= 2
    assert _slot_rows(dsn, schema) == []


def test_stale_worker_resumed_after_sigstop_frees_nothing_and_completes_nothing(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    client.set_limit("queue:lim", concurrency=2)
    marker = tmp_path / "ticks"
    ids = [
        int(
            client.enqueue(
                "ticker", {"marker": str(marker), "seconds": 3, "later": 2.5}, queue="lim"
            )
        )
        for _ in range(2)
    ]
    args = ("--queue", "lim", "--any-queue", "--lease-seconds", "1", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, "--poll-interval", "0.05", log_dir=tmp_path) as a:
        wait_for(lambda: len(_slot_rows(dsn, schema)) == 2, 30, "A to take both slots")
        a.signal(signal.SIGSTOP)
        wait_for(
            lambda: _count(dsn, schema, "status = 'running' AND lease_expires_at <= now()") == 2,
            10,
            "A's leases to expire",
        )
        client.sweep(policies={"ticker": QUICK_RETRY})
        with WorkerProcess(
            dsn,
            schema,
            "--queue",
            "lim",
            "--any-queue",
            "--lease-seconds",
            "5",
            "--drain",
            *FAST,
            log_dir=tmp_path,
        ) as b:
            wait_for(
                lambda: sorted(t for _, t in _slot_rows(dsn, schema)) == [2, 2],
                30,
                "B to hold both slots under token 2",
            )
            held = _slot_rows(dsn, schema)
            a.signal(signal.SIGCONT)  # A wakes up believing it holds both jobs
            # A's ticks under token 1 go on until its next renewal finds the leases lost;
            # whatever it writes is refused: B's slots and jobs are untouched.
            time.sleep(1.5)
            assert _slot_rows(dsn, schema) == held
            assert _count(dsn, schema, "status = 'running' AND lease_token = 2") == 2
            assert b.wait(60) == 0, b.output()[-2000:]
    for job_id in ids:
        job = client.get_job(job_id)
        assert job is not None and job.status == leaseq.JobStatus.SUCCEEDED
        assert job.lease_token == 2  # completed by B's lease, never by A's
    assert _slot_rows(dsn, schema) == []


def test_rate_limit_over_sixteen_workers_stays_within_rate_and_does_not_spin(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """16 in-process workers for ~10 s against 20/s burst 5: in every window of one second
    the claims (started_at) are at most rate*per + burst, and the claim statements sent stay
    bounded (the workers sleep until the bucket admits again)."""
    import asyncio

    from tests.support.apps.basic import app as basic_app

    rate, burst = 20.0, 5
    client.set_limit("queue:rl", rate=RateLimit(rate, per=1.0, burst=burst))
    client.enqueue_many([{"task": "noop", "queue": "rl"} for _ in range(400)])
    claims = {"n": 0}

    async def main() -> None:
        app = leaseq.App(dsn, schema=schema)
        app.tasks.update(basic_app.tasks)
        workers = []
        for i in range(16):
            cfg = leaseq.WorkerConfig(
                queues=("rl",),
                concurrency=4,
                poll_interval=1.0,
                listen=False,
                claims_in_flight=1,  # 16 pools of 4 connections
                worker_id=f"rl-{i}",
            )
            worker = leaseq.Worker(app, cfg)
            real = worker.client.claim

            async def counted(*a: object, _real: object = real, **kw: object) -> object:
                claims["n"] += 1
                return await _real(*a, **kw)  # type: ignore[operator]

            worker.client.claim = counted  # type: ignore[method-assign]
            workers.append(worker)
        tasks = [asyncio.create_task(w.run()) for w in workers]
        await asyncio.sleep(10)
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    started = [
        r[0]
        for r in rows(
            dsn,
            "SELECT extract(epoch FROM started_at)::float8 FROM {s}.jobs"
            " WHERE started_at IS NOT NULL ORDER BY started_at",
            schema,
        )
    ]
    assert len(started) >= 150  # ~20/s for ~10 s (plus the burst)
    bound = rate * 1.0 + burst
    for i, t in enumerate(started):
        in_window = sum(1 for u in started[i:] if u < t + 1.0)
        assert in_window <= bound, (i, in_window)
    # No busy loop: a refused worker sleeps until the bucket's next token (every 50 ms at
    # 20/s), so each of the 16 asks at most about 20 times a second; a spinning worker
    # would send thousands of claims a second.
    per_second = claims["n"] / 10
    print(f"claim statements: {claims['n']} in 10 s ({per_second:.0f}/s), admitted {len(started)}")
    assert per_second <= 16 * 25, per_second


def test_cli_sets_lists_and_removes_limits_and_refuses_bad_input_in_one_line(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    from tests.acceptance.test_cli import run

    run(dsn, schema, "migrate")
    out = run(dsn, schema, "limits", "set", "queue:emails", "--concurrency", "5", "--actor", "ann")
    assert "limit queue:emails set by ann: concurrency 5" in out.stdout
    run(dsn, schema, "limits", "set", "key:cust:*", "--rate", "10", "--per", "1", "--burst", "3")
    for i in range(3):
        client.enqueue("t", i, queue="emails")
    client.claim("emails", worker="w", limit=2)
    listed = run(dsn, schema, "limits", "list").stdout
    assert "queue:emails" in listed and "2/5" in listed and "10/1s burst 3" in listed
    status = run(dsn, schema, "status").stdout
    assert "queue:emails" in status and "2/5" in status
    as_json = run(dsn, schema, "limits", "list", "--json").stdout
    assert '"in_use": 2' in as_json
    for bad in (["pool:x", "--concurrency", "1"], ["queue:q"], ["queue:q", "--rate", "0"]):
        result = run(dsn, schema, "limits", "set", *bad, ok=False)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert [x.name for x in client.limits()] == ["key:cust:*", "queue:emails"]
    job = int(run(dsn, schema, "enqueue", "t", "--limit-key", "cust:7").stdout)
    assert rows(dsn, "SELECT limit_key FROM {s}.jobs WHERE id = %s", schema, job) == [("cust:7",)]
    assert "removed by" in run(dsn, schema, "limits", "remove", "queue:emails").stdout
    assert "no limit" in run(dsn, schema, "limits", "remove", "queue:emails").stdout
    actions = [e.action for e in client.admin_events()]
    assert actions.count("limit_set") == 2 and actions.count("limit_removed") == 1
