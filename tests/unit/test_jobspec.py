"""The one declaration of a job's options (leaseq.jobspec) against every place that must carry
them: each insert statement's column list, the unnested arrays and the COPY row, JobSpec and
EnqueueOptions, the enqueue signatures, the defaults in schema.sql, and the job columns every
read returns (models.Job's field order). A new option that misses a place fails here, naming
the place (CONTRIBUTING.md, "Adding a per-job option")."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any, get_type_hints

import pytest

import leaseq
from leaseq import jobspec
from leaseq.jobspec import (
    ARRAY_OPTIONS,
    COPY_COLUMNS,
    DEFAULTS,
    DERIVED_ARRAYS,
    DERIVED_COLUMNS,
    INSERT_STATEMENTS,
    OPTIONS,
    PATHS,
    UNIQUE_FIELDS,
    EnqueueOptions,
    JobSpec,
    columns_of,
    copy_row,
    job_arrays,
    job_fields,
    job_params,
)
from leaseq.models import Job
from leaseq.rules.unique import unique_params
from leaseq.sql import Queries, query_files

ROOT = Path(__file__).resolve().parents[2]
QUERIES = Queries("s")
NAMES = [o.name for o in OPTIONS]


def _insert_columns(statement: str) -> list[str]:
    """The column list of the statement's INSERT INTO / COPY of the jobs table."""
    m = re.search(r'(?:INSERT INTO|COPY)\s+"s"\.jobs\s*\(([^)]*)\)', statement)
    assert m, f"no insert into jobs found in:\n{statement[:300]}"
    return [c.strip() for c in m.group(1).split(",")]


@pytest.mark.parametrize(
    ("path", "statement"),
    [(path, name) for path, names in INSERT_STATEMENTS.items() for name in names],
)
def test_every_insert_statement_writes_the_columns_its_path_declares(
    path: str, statement: str
) -> None:
    written = _insert_columns(QUERIES[statement])
    assert len(written) == len(set(written)), f"{statement} names a column twice: {written}"
    declared = columns_of(path)
    missing = declared - set(written)
    extra = set(written) - declared - DERIVED_COLUMNS
    assert not missing, f"{statement} ({path} path) does not write {sorted(missing)}"
    assert not extra, f"{statement} writes {sorted(extra)}, which no option of {path} declares"


def test_every_path_has_its_statement_and_every_option_a_known_path() -> None:
    assert set(INSERT_STATEMENTS) == set(PATHS) - {"sig"}
    for option in OPTIONS:
        assert option.paths <= set(PATHS), option
        assert option.doc, f"option {option.name} says nothing about itself"


def test_the_arrays_path_unnests_one_array_per_option_in_order() -> None:
    statement = QUERIES["insert_jobs"]
    unnest = statement[statement.index("unnest(") : statement.index("WITH ORDINALITY")]
    params = re.findall(r"%\((\w+)\)s::\w+\[\]", unnest)
    assert tuple(params) == ARRAY_OPTIONS + DERIVED_ARRAYS
    alias = re.search(r"AS u\(([^)]*)\)", statement)
    assert alias is not None
    aliases = [a.strip() for a in alias.group(1).split(",")]
    assert aliases == [*ARRAY_OPTIONS, *DERIVED_ARRAYS, "ord"]
    p = job_params(job_fields({"task": "t"}), 100)
    assert set(job_arrays([p, p], "ch")) == {*ARRAY_OPTIONS, *DERIVED_ARRAYS, "channel"}


def test_the_copy_row_matches_copy_jobs_column_for_column() -> None:
    assert _insert_columns(QUERIES["copy_jobs"]) == list(COPY_COLUMNS)
    p = job_params(job_fields({"task": "t", "key_policy": "skip", "limit_key": "k"}), 100)
    row = copy_row(7, p, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert len(row) == len(COPY_COLUMNS)
    values = dict(zip(COPY_COLUMNS, row, strict=True))
    assert (values["id"], values["key_policy"], values["limit_key"]) == (7, "skip", "k")


def test_jobspec_and_enqueue_options_declare_every_option_with_one_type() -> None:
    spec_fields = [f.name for f in dataclasses.fields(JobSpec)]
    assert spec_fields == NAMES, "JobSpec's fields are OPTIONS' names, in order"
    assert list(EnqueueOptions.__annotations__) == NAMES[2:], "EnqueueOptions: all but task/payload"
    spec_types = get_type_hints(JobSpec)
    option_types = get_type_hints(EnqueueOptions)
    for name in NAMES[2:]:
        assert spec_types[name] == option_types[name], f"{name}: JobSpec and EnqueueOptions differ"
    for f in dataclasses.fields(JobSpec)[1:]:
        assert f.default == DEFAULTS[f.name], f"JobSpec.{f.name}'s default is not OPTIONS'"


def test_job_params_checks_every_option_and_refuses_unknown_ones() -> None:
    params = job_params(job_fields({"task": "t", "unique_key": "k"}), 100)
    stored = {o.name for o in OPTIONS if o.columns}
    assert stored - set(UNIQUE_FIELDS) <= params.keys()
    assert stored <= unique_params(params).keys(), "the unique path's parameters"
    with pytest.raises(leaseq.ConfigError, match=r"unknown job option\(s\): 'dealy'"):
        job_fields({"task": "t", "dealy": 5})


ENQUEUE_SIGNATURES = [
    leaseq.Client.enqueue,
    leaseq.AsyncClient.enqueue,
    leaseq.RoutedClient.enqueue,
    leaseq.AsyncRoutedClient.enqueue,
    leaseq.Task.enqueue,
    leaseq.Task.enqueue_async,
    leaseq.Task.sig,
]


@pytest.mark.parametrize("function", ENQUEUE_SIGNATURES, ids=lambda f: f.__qualname__)
def test_every_enqueue_takes_the_options_as_one_typed_mapping(function: Any) -> None:
    parameters = inspect.signature(function).parameters
    options = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert len(options) == 1 and "Unpack[EnqueueOptions]" in str(options[0].annotation)
    named = set(parameters) - {"self", "task", "payload", "connection", options[0].name}
    assert not named, f"{function.__qualname__} declares options of its own: {sorted(named)}"


def test_schema_defaults_are_the_declared_defaults() -> None:
    text = resources.files("leaseq.sql").joinpath("schema.sql").read_text("utf-8")
    jobs = text[text.index("CREATE TABLE {schema}.jobs") :]
    jobs = jobs[: jobs.index("\n);")]
    for column, option in [
        ("max_attempts", "max_attempts"),
        ("priority", "priority"),
        ("key_policy", "key_policy"),
    ]:
        m = re.search(rf"^\s*{column} \w+ NOT NULL DEFAULT ([^,\s]+)", jobs, re.MULTILINE)
        assert m, f"schema.sql: jobs.{column} has no default"
        assert m.group(1).strip("'") == str(DEFAULTS[option]), column


def test_job_columns_are_models_job_fields_in_order() -> None:
    fragment = re.search(
        r"-- name: _job_columns\n(?:--[^\n]*\n)*(.*?)(?:\n\n|\Z)",
        query_files()["shared.sql"],
        re.DOTALL,
    )
    assert fragment is not None
    columns = [c.strip() for c in fragment.group(1).split(",")]
    aliases = [re.split(r"\s+AS\s+", c)[-1] for c in columns]
    fields = [f.name for f in dataclasses.fields(Job) if f.name != "unreadable"]
    assert aliases == fields
    for name in ("get_job", "list_jobs", "web_jobs"):
        assert fragment.group(1).strip() in QUERIES[name], f"{name} reads its own job columns"


def test_the_signature_and_callback_options_are_the_declared_ones() -> None:
    assert {
        "queue",
        "priority",
        "run_at",
        "delay",
        "max_attempts",
        "payload_version",
        "idempotency_key",
        "on_dead",
        "expires",
        "fairness_key",
        "cost",
    } == jobspec.SIG_OPTIONS
    assert {"queue", "priority", "max_attempts", "cost"} == jobspec.CALLBACK_OPTIONS
    from leaseq.workflows import callback_spec

    spec = callback_spec(leaseq.Sig("cb", {"x": 1}))
    assert spec == {
        "task": "cb",
        "payload": {"x": 1},
        **{k: DEFAULTS[k] for k in ("queue", "priority", "max_attempts", "cost")},
    }


def test_a_misspelled_option_is_a_type_error(tmp_path: Path) -> None:
    """mypy (strict, as CI runs it) rejects ``enqueue("t", {}, dealy=5)`` on every enqueue."""
    pytest.importorskip("mypy")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "import leaseq\n"
        "client = leaseq.Client('postgresql://x')\n"
        "client.enqueue('t', {}, dealy=5)\n"
        "client.enqueue('t', {}, priority='high')\n"
        "app = leaseq.App()\n"
        "@app.task\n"
        "def t(ctx: leaseq.JobContext, payload: object) -> None: ...\n"
        "t.enqueue({}, priorty=2)\n"
        "client.enqueue('t', {}, delay=5, priority=2)\n"
    )
    # In a process of its own: mypy raises the recursion limit of the process it runs in.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--follow-imports=silent",
            "--no-error-summary",
            str(snippet),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    out, status = done.stdout, done.returncode
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1
    assert any(":3: error:" in e and '"dealy"' in e for e in errors), out
    assert any(":4: error:" in e and "priority" in e for e in errors), out
    assert any(":8: error:" in e and '"priorty"' in e for e in errors), out
    assert not any(":9: error:" in e for e in errors), out
