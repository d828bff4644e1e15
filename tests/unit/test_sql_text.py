"""The SQL files themselves: every statement named once, schema names cannot inject."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from leaseq.errors import ConfigError
from leaseq.sql import (
    Queries,
    _parse_queries,
    check_schema_name,
    latest_version,
    migrations,
    query_files,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_statement_the_code_names_exists() -> None:
    known = set(Queries("leaseq").names())
    used: set[str] = set()
    for path in (ROOT / "leaseq").rglob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r'(?:_rows|queries)\(?\[?\s*"(\w+)"', text))
    assert used, "the pattern found no statement names: the test itself is broken"
    assert used <= known, f"unknown statements: {sorted(used - known)}"


def test_schema_is_quoted_into_every_statement() -> None:
    q = Queries("my_schema")
    assert '"my_schema".jobs' in q["claim_jobs"]
    assert "{schema}" not in "".join(q[name] for name in q.names())


@pytest.mark.parametrize("bad", ["", "Upper", 'x"; drop table y; --', "1abc", "a" * 64, "a-b"])
def test_schema_names_that_could_break_quoting_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        check_schema_name(bad)


def test_migrations_are_numbered_without_gaps() -> None:
    found = migrations("leaseq")
    assert [m.version for m in found] == list(range(1, latest_version() + 1))


def test_generated_sync_client_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_sync.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


#: The most lines a file of ``leaseq/sql/queries/`` may have (issue 27: one section each).
MAX_SQL_FILE_LINES = 300


def test_each_sql_section_stays_short() -> None:
    sizes = {name: text.count("\n") for name, text in query_files().items()}
    assert len(sizes) >= 10, sizes
    assert {n: s for n, s in sizes.items() if s > MAX_SQL_FILE_LINES} == {}


def test_a_name_used_in_two_files_is_refused_naming_both() -> None:
    files = {"a.sql": "-- name: x\nSELECT 1;\n", "b.sql": "-- name: x\nSELECT 2;\n"}
    with pytest.raises(RuntimeError, match=r"duplicate query name x in a\.sql and b\.sql"):
        _parse_queries(files)


def test_fragments_are_shared_across_files_in_any_order() -> None:
    files = {
        "a.sql": "-- name: uses\nSELECT {_outer};\n",
        "b.sql": "-- name: _outer\n{_inner} + 1\n",
        "c.sql": "-- name: _inner\n41\n",
    }
    assert _parse_queries(files) == {"uses": "SELECT 41 + 1"}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.sql": "-- name: s\nSELECT {_nope}\n"}, "unknown fragment _nope"),
        ({"a.sql": "-- name: s\nSELECT {_a}\n-- name: _a\n{_a}\n"}, "includes itself"),
    ],
)
def test_a_bad_fragment_fails_at_load(files: dict[str, str], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        _parse_queries(files)
