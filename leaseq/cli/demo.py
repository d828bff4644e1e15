"""`leaseq demo`: the whole lifecycle in one command, on the embedded server by default.

The command and its tasks live here; the status table comes from ``leaseq.cli.render``.
A mixed batch shows each path of the state machine: plain successes, a transient failure
that succeeds on its third attempt, and a malformed order that fails permanently and ends
dead (kept, inspectable with `leaseq jobs show`, replayable with `leaseq replay`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from leaseq.app import App
from leaseq.cli.render import render_status
from leaseq.cli.settings import Settings, pass_settings
from leaseq.errors import Permanent, Retry
from leaseq.jobspec import JobSpec
from leaseq.retry import RetryPolicy
from leaseq.worker import JobContext, WorkerConfig, run_worker

# Short back-off so the demo's retries happen within a second or two.
app = App(retry_policy=RetryPolicy(base=0.1, cap=0.5))


@app.task(name="demo.send_email", queue="emails")
async def send_email(ctx: JobContext, payload: Any) -> None:
    """Always works."""


@app.task(name="demo.charge_card", queue="payments", max_attempts=5)
def charge_card(ctx: JobContext, payload: Any) -> None:
    """Fails twice with a transient error, then succeeds: retries with back-off."""
    if ctx.attempt < 3:
        raise Retry("UPSTREAM_TIMEOUT", f"payment API timed out (attempt {ctx.attempt})")
    if not isinstance(payload, dict) or "amount" not in payload:
        raise Permanent("INVALID_PAYLOAD", "order has no amount")


def run(
    dsn: str | None, *, schema: str, count: int, echo: Callable[[str], None] = print
) -> dict[str, int]:
    """Run the demo; returns how many of this batch's jobs ended in each state."""
    app.dsn = dsn
    app.schema = schema
    client = app.client
    try:
        echo(f"database: {client.dsn()} (schema {schema})")
        client.migrate()
        specs = [
            JobSpec("demo.send_email", {"to": f"user{i}@example.com"}, queue="emails")
            for i in range(max(count - 4, 1))
        ]
        specs += [
            JobSpec(
                "demo.charge_card", {"order": i, "amount": 10 * i}, queue="payments", max_attempts=5
            )
            for i in range(3)
        ]
        specs.append(
            JobSpec("demo.charge_card", {"order": "broken"}, queue="payments", max_attempts=5)
        )
        ids = client.enqueue_many(specs)
        echo(f"enqueued {len(ids)} jobs (ids {ids[0]}..{ids[-1]}); running a worker until drained")
        started = time.monotonic()
        run_worker(
            app,
            WorkerConfig(
                queues=("emails", "payments"),
                concurrency=8,
                lease_seconds=10,
                poll_interval=0.1,
                drain=True,
            ),
            install_signal_handlers=True,
        )
        elapsed = time.monotonic() - started
        outcome: dict[str, int] = {}
        for job_id in ids:
            job = client.get_job(job_id)
            state = str(job.status) if job else "missing"
            outcome[state] = outcome.get(state, 0) + 1
        echo(f"drained in {elapsed:.1f}s: " + ", ".join(f"{v} {k}" for k, v in outcome.items()))
        echo("")
        echo(render_status(client.queue_stats(throughput=True)))
        dead = [j for j in client.list_jobs("dead", limit=1) if j.job_id in ids]
        if dead:
            echo("")
            echo(f"job {dead[0].job_id} is dead ({dead[0].last_error_code}); try:")
            echo(f"  leaseq --schema {schema} jobs show {dead[0].job_id}")
            echo(f"  leaseq --schema {schema} replay {dead[0].job_id} --reason 'fixed the order'")
        return outcome
    finally:
        app.close()


@click.command()
@click.option("--jobs", "count", type=int, default=40, show_default=True)
@click.option("--schema", "demo_schema", default="leaseq_demo", show_default=True)
@pass_settings
def demo(settings: Settings, count: int, demo_schema: str) -> None:
    """Migrate, enqueue a mixed batch, drain it with a worker, print the status."""
    run(settings.dsn, schema=demo_schema, count=count, echo=click.echo)
