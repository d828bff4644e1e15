"""The SQL files themselves: every statement named once, schema names cannot inject."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from leaseq.errors import ConfigError
from leaseq.sql import Queries, check_schema_name, latest_version, migrations

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
