"""`leaseq jobs signal` and what `leaseq jobs show` says of a durable job, through the real
command line: a signal by id and by unique key, each refusal one line."""

from __future__ import annotations

import json

import leaseq
from tests.acceptance.test_cli import run


def test_jobs_signal_and_show(dsn: str, schema: str, client: leaseq.Client) -> None:
    job_id = client.enqueue("t", unique_key="order-9")
    out = run(dsn, schema, "jobs", "signal", str(job_id), "approved", "--payload", '{"by": "ada"}')
    assert out.returncode == 0, out.stderr
    assert f"job {job_id}: signal 'approved' sent by" in out.stdout
    again = run(dsn, schema, "jobs", "signal", "--unique-key", "order-9", "approved")
    assert again.returncode == 0, "a second send is the name's second delivery"
    other = run(dsn, schema, "jobs", "signal", "--unique-key", "order-9", "shipped")
    assert other.returncode == 0, other.stderr
    bad = run(dsn, schema, "jobs", "signal", str(job_id), "x", "--payload", "{nope", ok=False)
    assert bad.returncode != 0 and "--payload is not JSON" in bad.stderr
    missing = run(dsn, schema, "jobs", "signal", "999999999", "x", ok=False)
    assert missing.returncode == 1 and "job 999999999 not found" in missing.stderr
    (lease,) = client.claim(worker="w")
    assert client.step_record(lease, "fetch", 0, {"rows": 3})
    shown = run(dsn, schema, "jobs", "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert "steps:" in shown.stdout and "fetch" in shown.stdout
    assert "signals:" in shown.stdout and "shipped" in shown.stdout
    data = json.loads(run(dsn, schema, "jobs", "show", str(job_id), "--json").stdout)
    assert [s["name"] for s in data["steps"]] == ["fetch"]
    got = sorted(json.dumps([g["name"], g["payload"]]) for g in data["signals"])
    want = [["approved", {"by": "ada"}], ["approved", None], ["shipped", None]]
    assert got == sorted(json.dumps(w) for w in want)
    done = client.enqueue("t")
    (finished,) = client.claim(worker="w")
    assert finished.job_id == done and client.complete(finished)
    late = run(dsn, schema, "jobs", "signal", str(done), "approved", ok=False)
    assert late.returncode == 1 and late.stderr.strip().endswith("(the job has finished)")
    assert "Traceback" not in late.stderr and len(late.stderr.strip().splitlines()) == 1


def test_jobs_restart_from_step(dsn: str, schema: str, client: leaseq.Client) -> None:
    job_id = client.enqueue("t")
    (lease,) = client.claim(worker="w")
    assert client.step_record(lease, "fetch", 0, 1) and client.step_record(lease, "send", 1, 2)
    running = run(
        dsn,
        schema,
        "jobs",
        "restart",
        str(job_id),
        "--from-step",
        "send",
        "--reason",
        "r",
        ok=False,
    )
    assert running.returncode == 1 and "only a dead or cancelled job" in running.stderr
    assert client.fail(lease, "BOOM", retryable=False)
    out = run(
        dsn,
        schema,
        "jobs",
        "restart",
        str(job_id),
        "--from-step",
        "send",
        "--reason",
        "resend",
        "--actor",
        "ada",
    )
    assert f"job {job_id}: restarted from step 'send' by ada; dropped send" in out.stdout
    assert [s.name for s in client.job_steps(job_id)] == ["fetch"]
