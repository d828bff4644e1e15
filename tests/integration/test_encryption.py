"""Encrypted values at rest on a real PostgreSQL (docs/encryption.md): a task with
``encrypt=True`` stores its payloads, results and effect records sealed through every
enqueue path, a worker with the key runs them as plain values, a worker without it (or with
a value that does not authenticate) ends the job dead with the reason, and ``rotate_keys``
moves every stored value to the newest key while a worker drains."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import threading
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.codec import Keyring, generate_key, is_sealed, sealed_key_id
from leaseq.errors import EncryptionError
from tests.support.helpers import rows

ROOT = pathlib.Path(__file__).resolve().parents[2]
OLD, NEW = generate_key(), generate_key()
FAST = leaseq.RetryPolicy(base=0.001, cap=0.01)
SECRET = {"to": "ada@example.com", "card": "4111-1111"}


def _app(dsn: str, schema: str, keys: list[str] | None, **options: Any) -> leaseq.App:
    app = leaseq.App(dsn, schema=schema, retry_policy=FAST, encryption_keys=keys, **options)
    app.client.migrate()
    return app


def _drain(app: leaseq.App) -> leaseq.WorkerStats:
    config = leaseq.WorkerConfig(poll_interval=0.02, drain=True, concurrency=4)
    return asyncio.run(leaseq.Worker(app, config).run())


def _payloads(dsn: str, schema: str) -> list[Any]:
    return [r[0] for r in rows(dsn, "SELECT payload FROM {s}.jobs ORDER BY id", schema)]


def test_every_enqueue_path_stores_the_payload_sealed_and_the_worker_sees_it_plain(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema, [NEW])
    seen: list[Any] = []

    @app.task(name="mail", encrypt=True, store_result=True)
    def mail(ctx: leaseq.JobContext, payload: Any) -> Any:
        seen.append(payload)
        return {"sent": payload["to"]}

    @app.task(name="plain")
    def plain(ctx: leaseq.JobContext, payload: Any) -> None:
        seen.append(payload)

    single = mail.enqueue(SECRET)
    keyed = mail.enqueue(SECRET, ordering_key="k")
    unique = mail.enqueue(SECRET, unique_key="u")
    arrays = app.client.enqueue_many([{"task": "mail", "payload": SECRET}] * 3)
    copied = app.client.enqueue_many([{"task": "mail", "payload": SECRET}] * 250)
    flow = app.client.enqueue_flow(leaseq.chain(mail.sig(SECRET), mail.sig(SECRET)))
    unsealed = plain.enqueue({"n": 1})
    stored = {r[0]: r[1] for r in rows(dsn, "SELECT id, payload FROM {s}.jobs", schema)}
    for job_id in [single, keyed, unique, *arrays, copied[0], copied[-1], *flow]:
        assert is_sealed(stored[job_id]), f"job {job_id} stored in the clear"
        assert "ada" not in json.dumps(stored[job_id])
    assert stored[unsealed] == {"n": 1}

    _drain(app)
    assert seen.count(SECRET) == 3 + 3 + 250 + 2 and {"n": 1} in seen
    results = rows(dsn, "SELECT value FROM {s}.job_results", schema)
    assert results and all(is_sealed(r[0]) for r in results)
    assert app.client.result(single, timeout=1) == {"sent": "ada@example.com"}
    with pytest.raises(EncryptionError, match="no encryption keys"):
        client.result(single, timeout=1)  # a client without the key cannot read it


def test_a_worker_without_the_key_ends_the_job_dead_with_the_reason_and_replay_runs_it(
    dsn: str, schema: str
) -> None:
    writer = _app(dsn, schema, [OLD])

    @writer.task(name="pay", encrypt=True)
    def pay(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    job = pay.enqueue(SECRET)
    reader = _app(dsn, schema, [NEW])  # the old key was retired too early
    ran: list[Any] = []
    reader.task(name="pay")(lambda ctx, payload: ran.append(payload))
    _drain(reader)
    found = reader.client.get_job(job)
    assert found is not None and found.status is JobStatus.DEAD
    assert found.last_error_code == "ENCRYPTION_KEY_MISSING" and ran == []
    assert "ada" not in (found.last_error_detail or "")

    fixed = _app(dsn, schema, [NEW, OLD])
    fixed.task(name="pay")(lambda ctx, payload: ran.append(payload))
    assert fixed.client.replay(job, reason="the old key is back")
    _drain(fixed)
    assert ran == [SECRET]


def test_a_payload_that_does_not_authenticate_ends_dead_never_reaching_the_handler(
    dsn: str, schema: str
) -> None:
    app = _app(dsn, schema, [NEW])
    ran: list[Any] = []

    @app.task(name="pay", encrypt=True)
    def pay(ctx: leaseq.JobContext, payload: Any) -> None:
        ran.append(payload)

    job = pay.enqueue({"amount": 10})
    rows(
        dsn,
        "UPDATE {s}.jobs SET payload = jsonb_set(payload, '{{c}}',"
        " to_jsonb('A' || substr(payload->>'c', 2))) RETURNING 1",
        schema,
    )
    _drain(app)
    found = app.client.get_job(job)
    assert found is not None and found.status is JobStatus.DEAD
    assert found.last_error_code == "ENCRYPTION_FAILED" and ran == []


def test_effect_records_are_sealed_and_read_back_by_the_next_attempt(dsn: str, schema: str) -> None:
    app = _app(dsn, schema, [NEW])
    calls: list[str] = []

    @app.task(name="charge", encrypt=True)
    def charge(ctx: leaseq.JobContext, payload: Any) -> None:
        receipt = ctx.effect("bank", lambda key: calls.append(key) or {"receipt": "r-1"})
        assert receipt == {"receipt": "r-1"}
        if ctx.attempt == 1:
            raise leaseq.Retry("LATER", "once more", retry_in=0)

    charge.enqueue({})
    _drain(app)
    (stored,) = rows(dsn, "SELECT result FROM {s}.job_effects", schema)
    assert is_sealed(stored[0]) and len(calls) == 1


def test_rotation_moves_every_value_to_the_newest_key_while_a_worker_drains(
    dsn: str, schema: str
) -> None:
    old = _app(dsn, schema, [OLD])

    @old.task(name="slow", encrypt=True, store_result=True)
    def slow_old(ctx: leaseq.JobContext, payload: Any) -> Any:
        return payload

    for i in range(20):
        slow_old.enqueue({"i": i})
    # Half of them run under the old key, so results exist to rotate too.
    first = old.client.claim("default", worker="w", limit=10)
    for lease in first:
        assert old.client.step_record(lease, "s", 0, {"secret": lease.payload["i"]})
        old.client.complete_many([lease], results={lease.job_id: (json.dumps(lease.payload), 60)})

    both = _app(dsn, schema, [NEW, OLD])
    ran: list[Any] = []

    @both.task(name="slow", encrypt=True, store_result=True)
    def slow(ctx: leaseq.JobContext, payload: Any) -> Any:
        ran.append(payload)
        return payload

    drained = threading.Thread(target=_drain, args=(both,))
    drained.start()
    done = both.client.rotate_keys(batch=3)
    drained.join(60)
    assert done.left == {"jobs": 0, "payloads": 0, "results": 0, "effects": 0, "steps": 0}
    assert sorted(p["i"] for p in ran) == list(range(10, 20))
    newest = Keyring([NEW]).newest
    for query in (
        "SELECT payload FROM {s}.jobs",
        "SELECT value FROM {s}.job_results",
        "SELECT result FROM {s}.job_steps",  # step records: sealed, and rotated
    ):
        stored = rows(dsn, query, schema)
        assert stored and {sealed_key_id(r[0]) for r in stored} == {newest}, query
    failed = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status <> 'succeeded'", schema)
    assert failed == [(0,)]
    # The old key can go now: everything opens with the new one alone.
    assert _app(dsn, schema, [NEW]).client.result(first[0].job_id, timeout=1) == first[0].payload
    (step,) = _app(dsn, schema, [NEW]).client.step_records(first[0].job_id)
    assert step.result == {"secret": first[0].payload["i"]}


def _cli(dsn: str, schema: str, keys: str, *args: str) -> str:
    env = dict(os.environ, LEASEQ_DSN=dsn, LEASEQ_SCHEMA=schema, LEASEQ_ENCRYPTION_KEYS=keys)
    done = subprocess.run(
        [sys.executable, "-m", "leaseq", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cli_shows_a_sealed_payload_as_such_and_rotates(dsn: str, schema: str) -> None:
    app = _app(dsn, schema, [OLD])
    app.task(name="t", encrypt=True)(lambda ctx, payload: None)
    job = app.client.enqueue("t", SECRET)
    shown = _cli(dsn, schema, OLD, "jobs", "show", str(job))
    assert "(encrypted with key" in shown and "ada@example.com" not in shown
    out = _cli(dsn, schema, f"{NEW},{OLD}", "keys", "rotate")
    assert "rotated 1 value(s); left: 0" in out
    left = _cli(dsn, schema, NEW, "keys", "rotate", "--dry-run")
    assert left.strip() == "left: jobs 0, payloads 0, results 0, effects 0, steps 0"


def test_encrypting_without_keys_is_a_one_line_error_at_declaration(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASEQ_ENCRYPTION_KEYS", raising=False)
    app = leaseq.App(dsn, schema=schema)
    with pytest.raises(leaseq.ConfigError, match="encrypts but no encryption keys"):
        app.task(name="t", encrypt=True)(lambda ctx, payload: None)
    with pytest.raises(leaseq.ConfigError, match="needs encryption keys"):
        leaseq.App(dsn, schema=schema, encrypt=True)


def test_schedules_and_batch_callbacks_carry_their_payloads_sealed(dsn: str, schema: str) -> None:
    app = _app(dsn, schema, [NEW])
    seen: list[Any] = []

    @app.task(name="report", encrypt=True)
    def report(ctx: leaseq.JobContext, payload: Any) -> None:
        seen.append(payload)

    @app.task(name="member")
    def member(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    app.client.schedule_add("nightly", task="report", every=3600, payload=SECRET)
    (stored,) = rows(dsn, "SELECT payload FROM {s}.schedules", schema)
    assert is_sealed(stored[0])
    # A code schedule declared again (every worker start) keeps its envelope: not "changed".
    app.schedule("hourly", task=report, every=3600, payload=SECRET)
    app.client.sync_code_schedules(app.schedule_defs(), ["report"], actor="w1")
    first = rows(dsn, "SELECT payload, updated_by FROM {s}.schedules WHERE name='hourly'", schema)
    app.client.sync_code_schedules(app.schedule_defs(), ["report"], actor="w2")
    again = rows(dsn, "SELECT payload, updated_by FROM {s}.schedules WHERE name='hourly'", schema)
    assert first == again and is_sealed(first[0][0])
    app.client.schedule_run_now("nightly", actor="test")

    with app.client.batch(on_success=report.sig(SECRET)) as batch:
        batch.enqueue("member", None)
    (callback_spec,) = rows(dsn, "SELECT on_success FROM {s}.batches", schema)
    assert is_sealed(callback_spec[0]["payload"])
    _drain(app)
    assert SECRET in seen  # the schedule's run
    (callback,) = [p for p in seen if isinstance(p, dict) and "batch_id" in p]
    assert callback["payload"] == SECRET and callback["succeeded"] == 1
