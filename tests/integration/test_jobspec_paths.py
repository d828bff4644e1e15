"""Every enqueue path stores every option it declares (leaseq.jobspec's ``paths``): a job
enqueued by each path with each of its options set away from its default, read back from
its row. The unit parity test checks the statements' column lists; this one checks what
actually lands in the table, so a path that names a column but passes the wrong value (or
none) fails too. A new option with a column must get a value in :data:`VALUES`."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

import leaseq
from leaseq.jobspec import COPY_THRESHOLD, DEFAULTS, OPTIONS

_AT = dt.datetime(2040, 1, 2, 3, 4, 5, tzinfo=dt.UTC)

#: A value away from the default for each stored option, and the column values it gives.
VALUES: dict[str, tuple[Any, dict[str, Any]]] = {
    "queue": ("q-x", {"queue_name": "q-x"}),
    "priority": (7, {"priority": 7, "base_priority": 7}),
    "delay": (3600, {}),  # checked below: available_at about an hour from now
    "max_attempts": (3, {"max_attempts": 3}),
    "payload_version": (2, {"payload_version": 2}),
    "idempotency_key": ("ik-1", {"idempotency_key": "ik-1"}),
    "ordering_key": ("ok-1", {"ordering_key": "ok-1"}),
    "key_policy": ("skip", {"key_policy": "skip"}),
    "unique_key": ("uk-1", {"unique_key": "uk-1"}),
    "unique_for": (60, {"unique_for": 60.0}),
    "unique_states": (
        ["pending", "running", "dead"],
        {"unique_states": ["pending", "running", "dead"]},
    ),
    "limit_key": ("lk-1", {"limit_key": "lk-1"}),
    "expires": (_AT, {"expires_at": _AT}),
    "fairness_key": ("fk-1", {"fairness_key": "fk-1"}),
    "cost": (3, {"cost": 3}),
}
#: Options with a column that cannot be set on their own (checked by their own tests).
TOGETHER = {"task", "payload", "run_at", "debounce_max"}


def _path_options(path: str) -> dict[str, Any]:
    return {o.name: VALUES[o.name][0] for o in OPTIONS if path in o.paths and o.name in VALUES}


def _row(dsn: str, schema: str, job_id: int) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        query = sql.SQL("SELECT *, available_at - now() AS wait FROM {}.jobs WHERE id = %s")
        found = conn.execute(query.format(sql.Identifier(schema)), (job_id,)).fetchone()
    assert found is not None, f"job {job_id} not stored"
    return found


def _check(row: dict[str, Any], options: dict[str, Any], path: str) -> None:
    for name in options:
        for column, value in VALUES[name][1].items():
            assert row[column] == value, f"{path}: {name} stored {column}={row[column]!r}"
    if "delay" in options:
        assert dt.timedelta(minutes=59) < row["wait"] <= dt.timedelta(hours=1), path


def test_every_stored_option_has_a_value_here() -> None:
    stored = {o.name for o in OPTIONS if o.columns} - TOGETHER
    assert stored == VALUES.keys(), "give the new option a non-default value in VALUES"
    for name, (value, _) in VALUES.items():
        assert value != DEFAULTS[name]


@pytest.mark.parametrize("path", ["insert", "keyed", "unique"])
def test_single_enqueue_paths(path: str, client: leaseq.Client, dsn: str, schema: str) -> None:
    options = _path_options(path)
    if path == "insert":
        options.pop("ordering_key", None)
    job_id = client.enqueue("t", {"path": path}, **options)
    row = _row(dsn, schema, job_id)
    assert row["payload"] == {"path": path}
    _check(row, options, path)


@pytest.mark.parametrize("n", [2, COPY_THRESHOLD], ids=["arrays", "copy"])
def test_bulk_enqueue_paths(n: int, client: leaseq.Client, dsn: str, schema: str) -> None:
    path = "arrays" if n < COPY_THRESHOLD else "copy"
    options = _path_options(path)
    ids = client.enqueue_many([{"task": "t", "payload": i, **options} for i in range(n)])
    for i in (0, n - 1):
        row = _row(dsn, schema, ids[i])
        assert row["payload"] == i
        # Jobs of one ordering key: only the first heads it, the rest wait behind it.
        assert row["blocked"] == ("ordering_key" in options and i > 0)
        _check(row, options, path)


def test_signature_path(client: leaseq.Client, dsn: str, schema: str) -> None:
    app = leaseq.App(dsn, schema=schema)
    step = app.task(name="step")(lambda ctx, p: None)
    options = _path_options("sig")
    options.pop("on_dead", None)  # an edge's policy, not a column
    first, second = client.enqueue_flow(leaseq.chain(step.sig(1, **options), step.sig(2)))
    _check(_row(dsn, schema, first), options, "sig")
    assert _row(dsn, schema, second)["waiting"]


def test_batch_callback_path(client: leaseq.Client, dsn: str, schema: str) -> None:
    app = leaseq.App(dsn, schema=schema)
    done = app.task(name="done")(lambda ctx, p: None)
    options = _path_options("callback")
    with client.batch(on_success=done.sig({"cb": 1}, **options)) as batch:
        member = batch.enqueue("t", None)
    (lease,) = client.claim("default", worker="w")
    assert lease.job_id == member and client.complete(lease)
    (callback,) = [
        r for r in client.list_jobs("pending", queue=options["queue"], limit=10) if r.task == "done"
    ]
    row = _row(dsn, schema, callback.job_id)
    assert row["payload"]["payload"] == {"cb": 1}
    _check(row, options, "callback")


def test_schedule_tick_path(client: leaseq.Client, dsn: str, schema: str) -> None:
    client.schedule_add("every", task="t", every=1, queue="q-x", priority=7, max_attempts=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = "UPDATE {}.schedules SET next_tick = now() - interval '1 second'"
        conn.execute(sql.SQL(query).format(sql.Identifier(schema)))
    client.tick_schedules()
    (job,) = client.list_jobs("pending", queue="q-x", limit=10)
    row = _row(dsn, schema, job.job_id)
    _check(row, {"queue": 1, "priority": 1, "max_attempts": 1}, "tick")
    assert row["idempotency_key"].startswith("leaseq.schedule@")
