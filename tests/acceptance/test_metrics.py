"""Metrics and logs as an operator sees them: scraped over HTTP from real processes while a
scripted scenario makes every kind of transition happen."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import urllib.error
import urllib.request
from importlib import resources

import yaml
from prometheus_client.parser import text_string_to_metric_families

import leaseq
from leaseq.metrics import METRICS, exported_names
from tests.support.helpers import expire_lease, rows, run_sql
from tests.support.ports import free_port
from tests.support.procs import ROOT, WorkerProcess, wait_for


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_every_worker_metric_moves_with_its_transition(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = (
        "--lease-seconds",
        "1.5",
        "--sweep-interval",
        "0.2",
        "--poll-interval",
        "0.05",
        "--metrics-port",
        str(port),
    )
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as worker:
        wait_for(lambda: _get(f"{base}/healthz")[0] == 200, 30, "the metrics endpoint")
        assert _get(f"{base}/readyz")[0] == 200
        assert _get(f"{base}/nope")[0] == 404

        # five successes; one job failing three times (unknown class): 2 retries, then dead
        client.enqueue_many([{"task": "noop"}] * 5)
        client.enqueue("always_fails", max_attempts=3)
        # a lease lost under a running handler. Its thread sleeps in one C call, which the
        # soft stop cannot interrupt, and the worker's exit waits for it (docs/worker.md,
        # "Stopping a sync handler"): 8 s outlasts the scenario, and ends well inside the
        # exit's wait below.
        marker = tmp_path / "started"
        slow = client.enqueue(
            "touch_then_sleep", {"marker": str(marker), "seconds": 8, "sleep_token": 1}
        )
        wait_for(marker.exists, 30, "the slow job to start")
        expire_lease(dsn, schema, slow)
        # a lease abandoned by a crashed worker, for this worker's sweeper
        ghost_job = client.enqueue("noop", queue="elsewhere")
        (ghost,) = client.claim("elsewhere", worker="ghost")
        expire_lease(dsn, schema, ghost.job_id)

        def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            return _samples(_get(f"{base}/metrics")[1])

        def settled() -> bool:
            s = scraped()
            return (
                _value(s, "leaseq_jobs_finished_total", queue="default", outcome="dead") == 1
                and _value(s, "leaseq_leases_lost_total", reason="LEASE_LOST") == 1
                and _value(s, "leaseq_lease_expirations_total", outcome="requeued") == 2
                and _value(s, "leaseq_jobs_finished_total", queue="default", outcome="succeeded")
                == 6  # five noops, and the slow job's second attempt after the sweep
            )

        wait_for(settled, 30, "the scenario to play out")
        s = scraped()
        worker.signal(15)
        assert worker.wait(30) == 0
    assert _value(s, "leaseq_jobs_claimed_total", queue="default") == 10
    assert _value(s, "leaseq_jobs_finished_total", queue="default", outcome="retried") == 2
    assert (
        _value(s, "leaseq_retries_total", queue="default", error_code="RuntimeError", attempt="1")
        == 1
    )
    assert (
        _value(s, "leaseq_retries_total", queue="default", error_code="RuntimeError", attempt="2")
        == 1
    )
    assert _value(s, "leaseq_lost_fence_total", operation="heartbeat") == 1
    assert _value(s, "leaseq_completion_latency_seconds_count", queue="default") == 9
    assert _value(s, "leaseq_claim_latency_seconds_count", queue="default") == 10
    assert _value(s, "leaseq_claim_statement_seconds_count") > 0
    assert _value(s, "leaseq_worker_slots") == 10
    assert _value(s, "leaseq_database_up") == 1
    assert (
        _value(s, "leaseq_worker_db_connections", state="in_use")
        + _value(s, "leaseq_worker_db_connections", state="idle")
        >= 1
    )
    assert client.get_job(ghost_job) is not None
    names = {name for name, _ in s}
    assert names <= exported_names(), names - exported_names()
    assert not any("job_id" in dict(labels) for _, labels in s), "no job ids as labels"


def test_database_metrics_endpoint(dsn: str, schema: str, client: leaseq.Client) -> None:
    # queue "mail": 2 ready (waiting 5 minutes), 1 scheduled, 1 running, 1 dead
    client.enqueue_many([{"task": "t", "queue": "mail"}] * 2)
    to_fail = client.enqueue("t", queue="mail", priority=10, max_attempts=1)
    to_run = client.enqueue("t", queue="mail", priority=5)
    run_sql(dsn, "UPDATE {s}.jobs SET available_at = now() - interval '5 minutes'", schema)
    client.enqueue("t", queue="mail", delay=3600)
    (first,) = client.claim("mail", worker="w")
    assert first.job_id == to_fail and client.fail(first, "BROKEN", retryable=False)
    (second,) = client.claim("mail", worker="w")
    assert second.job_id == to_run
    # queue "pay": 1 running whose lease already ended (its worker died)
    client.enqueue("t", queue="pay")
    (stale,) = client.claim("pay", worker="gone")
    expire_lease(dsn, schema, stale.job_id)

    port = free_port()
    env = dict(os.environ, LEASEQ_DSN=dsn, LEASEQ_SCHEMA=schema)
    proc = subprocess.Popen(
        [sys.executable, "-m", "leaseq", "metrics", "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(f"{url}/readyz")[0] == 200, 30, "metrics serve")
        s = _samples(_get(f"{url}/metrics")[1])
    finally:
        proc.terminate()
        proc.wait(10)
    assert _value(s, "leaseq_jobs", queue="mail", state="scheduled") == 1
    assert _value(s, "leaseq_jobs", queue="mail", state="dead") == 1
    assert _value(s, "leaseq_jobs", queue="mail", state="running") == 1
    assert _value(s, "leaseq_jobs", queue="mail", state="ready") == 2
    assert 290 < _value(s, "leaseq_oldest_claimable_age_seconds", queue="mail") < 400
    assert _value(s, "leaseq_oldest_claimable_age_seconds", queue="pay") == 0
    assert _value(s, "leaseq_oldest_dead_age_seconds", queue="mail") >= 0
    assert _value(s, "leaseq_expired_leases") == 1
    assert _value(s, "leaseq_jobs", queue="pay", state="running") == 1
    assert _value(s, "leaseq_metrics_query_seconds") > 0
    assert {name for name, _ in s} <= exported_names()


def test_alert_rules_parse_and_name_only_exported_metrics() -> None:
    text = resources.files("leaseq").joinpath("alerts/leaseq-rules.yml").read_text()
    rules = [r for group in yaml.safe_load(text)["groups"] for r in group["rules"]]
    assert len(rules) >= 6
    known = exported_names()
    for rule in rules:
        expr = rule["expr"]
        assert rule["alert"].startswith("Leaseq") and rule["annotations"]["summary"]
        assert expr.count("(") == expr.count(")"), rule["alert"]
        used = set(re.findall(r"\bleaseq_[a-z_]+", expr))
        assert used and used <= known, (rule["alert"], used - known)
    covered = {m for r in rules for m in re.findall(r"\bleaseq_[a-z_]+", r["expr"])}
    for must in (
        "leaseq_oldest_claimable_age_seconds",
        "leaseq_lost_fence_total",
        "leaseq_lease_expirations_total",
        "leaseq_heartbeat_failures_total",
        "leaseq_jobs_finished_total",
        "leaseq_schedule_lag_seconds",
    ):
        assert must in covered


def test_metrics_table_is_documented() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text()
    missing = [m.name for m in METRICS if f"`{m.name}`" not in page]
    assert not missing, f"docs/metrics.md lacks these metrics: {missing}"


def test_json_logs_carry_job_fields_and_no_payload(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    client.enqueue("always_fails", {"secret": "do-not-log-me"}, max_attempts=1)
    client.enqueue("noop", {"secret": "do-not-log-me"})
    env = dict(os.environ, LEASEQ_DSN=dsn, LEASEQ_SCHEMA=schema, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "leaseq",
            "-vv",
            "--log-format",
            "json",
            "worker",
            "tests.support.apps.basic:app",
            "--burst",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    jobs = [r for r in records if r["logger"] == "leaseq.jobs"]
    # Attempts at debug; a job that ends dead (or is retried) at warning, naming its task.
    assert {r["level"] for r in jobs} == {"debug", "warning"}
    for record in jobs:
        assert {"job_id", "task", "queue", "attempt", "token", "time"} <= record.keys()
    assert "do-not-log-me" not in result.stderr
    dead = [r for r in jobs if r.get("status") == "dead"]
    assert dead and dead[0]["error_code"] == "RuntimeError"
    assert dead[0]["level"] == "warning" and dead[0]["task"] == "always_fails"
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'dead'", schema) == [(1,)]


def test_loop_metrics_expose_exactly_what_prometheus_client_would() -> None:
    """The per-job metrics skip prometheus_client's locks (LoopHistogram, LoopCounter): a
    scrape must read the same text as from its own Histogram and Counter, bucket edges,
    +Inf and sums included."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from leaseq.metrics import LATENCY_BUCKETS, LoopCounter, LoopHistogram

    theirs, ours = CollectorRegistry(), CollectorRegistry()
    hist = Histogram("x_seconds", "help", ["queue"], buckets=LATENCY_BUCKETS, registry=theirs)
    count = Counter("x_total", "help", ["queue", "outcome"], registry=theirs)
    loop_hist = LoopHistogram("x_seconds", "help", ("queue",), LATENCY_BUCKETS)
    loop_count = LoopCounter("x_total", "help", ("queue", "outcome"))
    ours.register(loop_hist)
    ours.register(loop_count)
    values = [0.0, 0.005, 0.0051, 1, 2.5, 59.9, 3600, 3600.5, 1e9, 0.3, 0.3]
    for i, value in enumerate(values):
        queue = "a" if i % 3 else "b"
        hist.labels(queue).observe(value)
        loop_hist.labels(queue).observe(value)
        count.labels(queue, "ok").inc()
        loop_count.inc(queue, "ok")
    # leaseq's own processes switch the *_created series off; importing leaseq does not.
    expected = "".join(
        line for line in generate_latest(theirs).decode().splitlines(True) if "_created" not in line
    )
    assert generate_latest(ours).decode() == expected
