"""Python's client and the SQL API accept and refuse exactly the same inputs.

Table-driven over the one options declaration (``leaseq.jobspec.OPTIONS``): every option
has cases here (a new option without any fails :func:`test_every_option_has_cases`), each
case is one job given to ``Client.enqueue_many`` and to ``{schema}.enqueue_many`` (the same
values as JSON), in a fresh schema, and the two must agree: both store it, or both refuse
it with the same kind of error (ConfigError = SQLSTATE LQ001, PayloadError = LQ002), each
in one line. ``run_at`` is a datetime for Python and its ISO text for SQL.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq.errors import SQLSTATES, LeaseqError
from leaseq.jobspec import OPTIONS

NOW = dt.datetime.now(dt.UTC)


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


PARENT, BATCH = "<parent>", "<batch>"

#: option -> values that both must accept, and values that both must refuse (given with
#: the options in ``with``, the third element, when the option needs others).
CASES: dict[str, list[tuple[Any, bool, dict[str, Any]]]] = {
    "task": [
        ("emails.send", True, {}),
        ("a/b:c-d_e", True, {}),
        ("x" * 128, True, {}),
        ("x" * 129, False, {}),
        ("", False, {}),
        ("bad name!", False, {}),
        (".dot", False, {}),
        ("tail\n", False, {}),
        (7, False, {}),
        (None, False, {}),
    ],
    "payload": [
        ({"to": "a@example.com"}, True, {}),
        ([1, "two", None, True, 2.5], True, {}),
        ("x" * (1024 * 1024 - 2), True, {}),  # exactly the limit with its quotes
        ("x" * (1024 * 1024 - 1), False, {}),
        # Under the limit in the compact form only (jsonb's text adds a space per comma).
        (["x" * 1000] * 1045, True, {}),
        (["x" * 1000] * 1046, False, {}),
        (_nested(64), True, {}),
        (_nested(65), False, {}),
    ],
    "queue": [("emails", True, {}), ("bad queue", False, {}), (None, False, {}), (1, False, {})],
    "priority": [
        (32767, True, {}),
        (-32768, True, {}),
        (32768, False, {}),
        (1.5, False, {}),
        (2.0, False, {}),
        (True, False, {}),
        ("1", False, {}),
        (None, False, {}),
    ],
    "run_at": [
        (NOW + dt.timedelta(hours=1), True, {}),
        (NOW - dt.timedelta(days=1), True, {}),
        (dt.datetime(2030, 1, 1), False, {}),  # naive
        (NOW + dt.timedelta(days=365 * 101), False, {}),
        (NOW, False, {"delay": 5}),
    ],
    "delay": [
        (0, True, {}),
        (30.5, True, {}),
        (-1, False, {}),
        (3153600001, False, {}),
        ("5", False, {}),
        (True, False, {}),
    ],
    "max_attempts": [(1, True, {}), (10000, True, {}), (0, False, {}), (10001, False, {})],
    "payload_version": [
        (0, True, {}),
        (None, True, {}),
        (-1, False, {}),
        (2**31, False, {}),
        ("2", False, {}),
    ],
    "idempotency_key": [
        ("k" * 200, True, {}),
        ("k" * 201, False, {}),
        ("", False, {}),
        (5, False, {}),
    ],
    "ordering_key": [("o1", True, {}), ("o" * 201, False, {}), ("", False, {}), ([], False, {})],
    "fairness_key": [("f1", True, {}), ("f" * 201, False, {}), ("", False, {}), (3, False, {})],
    "cost": [(3, True, {}), (1000, True, {}), (0, False, {}), (1001, False, {}), ("2", False, {})],
    "key_policy": [
        ("skip", True, {"ordering_key": "o"}),
        ("block", True, {}),
        ("later", False, {}),
        (None, False, {}),
    ],
    "unique_key": [
        ("u1", True, {}),
        ("u" * 201, False, {}),
        ("", False, {}),
        (3, False, {}),
        ("u2", True, {"ordering_key": "o2"}),
    ],
    "unique_for": [
        (60, True, {"unique_key": "w"}),
        (0, False, {"unique_key": "w"}),
        (315360001, False, {"unique_key": "w"}),
        ("60", False, {"unique_key": "w"}),
        (60, False, {}),
    ],
    "unique_states": [
        (["pending", "running"], True, {"unique_key": "s"}),
        (["running", "pending", "pending"], True, {"unique_key": "s"}),
        (["pending", "running", "dead"], True, {"unique_key": "s", "unique_for": 5}),
        (["pending", "running", "dead"], False, {"unique_key": "s"}),
        (["pending"], False, {"unique_key": "s"}),
        (["pending", "running", "lost"], False, {"unique_key": "s"}),
        ("pending", False, {"unique_key": "s"}),
        (["pending", "running"], False, {}),
    ],
    "on_conflict": [
        ("raise", True, {"unique_key": "c"}),
        ("replace", True, {"unique_key": "c"}),
        ("merge", False, {"unique_key": "c"}),
        ("skip", False, {}),
    ],
    "debounce": [
        (5, True, {"unique_key": "d"}),
        (5, False, {"unique_key": "d", "on_conflict": "skip"}),
        (5, False, {"unique_key": "d", "delay": 1}),
        (-5, False, {"unique_key": "d"}),
    ],
    "debounce_max": [
        (10, True, {"unique_key": "m", "debounce": 5}),
        (1, False, {"unique_key": "m", "debounce": 5}),
        (10, False, {"unique_key": "m"}),
    ],
    "limit_key": [("customer:1", True, {}), ("l" * 201, False, {}), ("", False, {})],
    "depends_on": [
        ([PARENT], True, {}),
        ([PARENT, PARENT], True, {}),
        ([], True, {}),
        ([999_999_999], False, {}),
        ([0], False, {}),
        ([1.5], False, {}),
        (["1"], False, {}),
        (5, False, {}),
        ("1", False, {}),
        ([PARENT], False, {"ordering_key": "o"}),
        ([PARENT], False, {"unique_key": "dep"}),
    ],
    "on_dead": [
        ("run", True, {"depends_on": [PARENT]}),
        ("sometimes", False, {"depends_on": [PARENT]}),
        ("sometimes", True, {}),  # checked only with dependencies, in both
    ],
    "expires": [
        (60, True, {}),
        (NOW + dt.timedelta(hours=1), True, {}),
        (NOW - dt.timedelta(hours=1), True, {}),
        (0, False, {}),
        (3153600001, False, {}),
        (dt.datetime(2030, 1, 1), False, {}),  # naive
        ("soon", False, {}),
        (True, False, {}),
    ],
    "batch_id": [
        (BATCH, True, {}),
        (999_999_999, False, {}),
        (0, False, {}),
        ("1", False, {}),
        (BATCH, False, {"unique_key": "b"}),
    ],
}

#: Cases of the job as a whole.
WHOLE: list[tuple[dict[str, Any], bool]] = [
    ({"task": "t", "dealy": 5}, False),
    ({"payload": 1}, False),
]


def test_every_option_has_cases() -> None:
    missing = [o.name for o in OPTIONS if o.name not in CASES]
    assert not missing, f"options without parity cases: {missing}"
    for name, cases in CASES.items():
        assert {ok for _, ok, _ in cases} == {True, False}, f"{name} needs both kinds of case"


def _jobs() -> list[tuple[str, dict[str, Any], bool]]:
    out = []
    for name, cases in CASES.items():
        for i, (value, ok, others) in enumerate(cases):
            job = {"task": "t", **others, name: value}
            out.append((f"{name}-{i}", job, ok))
    out += [(f"whole-{i}", job, ok) for i, (job, ok) in enumerate(WHOLE)]
    return out


def _fill(value: Any, parent: int, batch: int) -> Any:
    if value == PARENT:
        return parent
    if value == BATCH:
        return batch
    if isinstance(value, list):
        return [_fill(v, parent, batch) for v in value]
    return value


def _as_json(job: dict[str, Any]) -> str:
    return json.dumps(
        {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in job.items()}
    )


def _python(client: leaseq.Client, job: dict[str, Any]) -> type[LeaseqError] | None:
    try:
        client.enqueue_many([job])
    except LeaseqError as exc:
        assert "\n" not in str(exc)
        return type(exc)
    return None


def _sql(dsn: str, schema: str, job: dict[str, Any]) -> type[LeaseqError] | None:
    with psycopg.connect(dsn) as conn:
        try:
            conn.execute(
                sql.SQL("SELECT {}.enqueue_many(%s::jsonb)").format(sql.Identifier(schema)),
                (f"[{_as_json(job)}]",),
            )
        except psycopg.Error as exc:
            message = exc.diag.message_primary or ""
            assert exc.sqlstate in SQLSTATES, f"not one of leaseq's SQLSTATEs: {exc}"
            assert message and "\n" not in message
            return SQLSTATES[exc.sqlstate]
        conn.commit()
    return None


@pytest.fixture()
def sql_side(dsn: str) -> Iterator[leaseq.Client]:
    """The schema the SQL side enqueues into (the Python side has its own, so a unique key
    one side took does not make the other's case a conflict)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    other = leaseq.Client(dsn, schema=name)
    other.migrate()
    yield other
    other.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def test_python_and_sql_accept_and_refuse_the_same_jobs(
    client: leaseq.Client, dsn: str, sql_side: leaseq.Client
) -> None:
    parents = (client.enqueue("parent"), sql_side.enqueue("parent"))
    disagree = []
    for label, spec, ok in _jobs():
        wants_batch = spec.get("batch_id") == BATCH
        batches = (client.create_batch(), sql_side.create_batch()) if wants_batch else (0, 0)
        job = {k: _fill(v, parents[0], batches[0]) for k, v in spec.items()}
        sql_job = {k: _fill(v, parents[1], batches[1]) for k, v in spec.items()}
        python, in_sql = _python(client, job), _sql(dsn, sql_side.schema, sql_job)
        expected = None if ok else "a refusal"
        if python != in_sql or (python is None) != ok:
            disagree.append(f"{label}: expected {expected}, python {python}, sql {in_sql}")
    assert not disagree, "\n".join(disagree)


def test_the_typed_enqueue_goes_through_the_same_checks(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """enqueue()'s typed arguments are checked as enqueue_many's (a NULL is the default)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        run = sql.SQL("SELECT {}.enqueue('t', priority => %s, queue => %s)").format(
            sql.Identifier(schema)
        )
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(run, (50_000, "emails"))
        assert caught.value.sqlstate == "LQ001"
        with pytest.raises(leaseq.ConfigError):
            client.enqueue("t", priority=50_000, queue="emails")
        row = conn.execute(run, (None, "emails")).fetchone()
    assert row is not None and client.get_job(row[0]).priority == 0
