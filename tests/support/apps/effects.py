"""Tasks for the side-effect crash tests: they call a loopback HTTP "payment service"
started by the test (its URL is in the payload) and can be killed mid-flight."""

from __future__ import annotations

import json
import pathlib
import time
import urllib.request
from typing import Any

import leaseq

app = leaseq.App(retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


def _post(url: str, key: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/charge", data=b"{}", method="POST", headers={"Idempotency-Key": key}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def _die_here_on_first_attempt(ctx: leaseq.JobContext, payload: Any) -> None:
    """The test kills the process while it waits here (after the call, before any record)."""
    if ctx.fencing_token == 1:
        pathlib.Path(payload["marker"]).write_text("called")
        time.sleep(60)


@app.task(name="pay_key_only")
def pay_key_only(ctx: leaseq.JobContext, payload: Any) -> None:
    _post(payload["url"], ctx.idempotency_key)
    _die_here_on_first_attempt(ctx, payload)


def _charge(ctx: leaseq.JobContext, payload: Any) -> Any:
    def call(key: str) -> dict[str, Any]:
        result = _post(payload["url"], key)
        _die_here_on_first_attempt(ctx, payload)
        return result

    return ctx.effect("charge", call)


def _ask_the_service(ctx: leaseq.JobContext, record: leaseq.EffectRecord) -> str:
    """Reconcile: the payment service knows whether this key was charged."""
    key = ctx.effect_key(record.name, record.key or None)
    url = ctx.lease.payload["url"]
    with urllib.request.urlopen(f"{url}/charges/{key}", timeout=5) as response:
        return "done" if json.loads(response.read())["acted"] else "redo"


@app.task(name="pay_reconciled", reconcile={"charge": _ask_the_service})
def pay_reconciled(ctx: leaseq.JobContext, payload: Any) -> None:
    _charge(ctx, payload)


@app.task(name="pay_unreconciled")
def pay_unreconciled(ctx: leaseq.JobContext, payload: Any) -> None:
    _charge(ctx, payload)
