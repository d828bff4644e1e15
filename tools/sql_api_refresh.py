"""Keep the SQL API's copies of the client's statements equal to the statements.

The SQL API (docs/sql-api.md: ``{schema}.enqueue``, ``enqueue_many``, ``cancel``, ...) is
plpgsql in the migrations. Where it does what the Python client does (insert a job, take
a unique key, store dependencies, cancel), it runs the client's own named statements from
``leaseq/sql/queries/*.sql``, copied into the function body between two marker lines::

    -- statement: insert_job
    INSERT INTO {schema}.jobs ...            (the statement, parameters as p_NAME)
    -- end: insert_job

This script writes those copies: ``%(NAME)s`` becomes the plpgsql variable ``p_NAME``
(each function declares the ones its statements use), fragments are expanded as the
client expands them, and the text is otherwise the statement's.

- ``python tools/sql_api_refresh.py`` (or ``--check``): exit 1, naming them, when the
  latest definition of some SQL API function (the newest migration defining it) or
  ``schema.sql`` holds a copy that differs from the statement today. A unit test runs it.
- ``--fill PATH``: rewrite the copies in PATH in place (a migration not landed yet, and
  ``leaseq/sql/schema.sql``).
- ``--new NAME``: a statement changed after its migration landed: write migration
  ``NNNN_NAME.sql`` re-creating (``CREATE OR REPLACE``) every function whose copy is stale,
  refreshed, and refresh schema.sql's copies. The migration is the record of what a
  database's functions run; the old migration stays as it was.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SQL = ROOT / "leaseq" / "sql"
MIGRATIONS = SQL / "migrations"
SCHEMA_SQL = SQL / "schema.sql"

sys.path.insert(0, str(ROOT))

from leaseq.sql import _query_texts  # noqa: E402

_BLOCK_RE = re.compile(r"^-- statement: (\w+)\n(.*?)^-- end: \1\n", re.MULTILINE | re.DOTALL)
_FUNCTION_RE = re.compile(
    r"^CREATE (?:OR REPLACE )?FUNCTION \{schema\}\.(\w+)\((.*?)^\$fn\$;\n",
    re.MULTILINE | re.DOTALL,
)
_PARAM_RE = re.compile(r"%\((\w+)\)s")


def statement_copy(name: str) -> str:
    """The text the SQL API holds for statement ``name`` (ending in a newline)."""
    texts = _query_texts()
    if name not in texts:
        raise SystemExit(f"the SQL API copies an unknown statement {name}")
    return _PARAM_RE.sub(r"p_\1", texts[name]).replace("%%", "%") + "\n"


def statement_params(name: str) -> list[str]:
    """The parameters of statement ``name``, as the plpgsql variables they become."""
    return sorted({"p_" + p for p in _PARAM_RE.findall(_query_texts()[name])})


def fill(text: str) -> str:
    """``text`` with every copy rewritten from its statement."""
    return _BLOCK_RE.sub(
        lambda m: f"-- statement: {m.group(1)}\n{statement_copy(m.group(1))}-- end: {m.group(1)}\n",
        text,
    )


def stale(text: str) -> list[str]:
    """The statements whose copies in ``text`` differ from the statements."""
    return sorted(
        {m.group(1) for m in _BLOCK_RE.finditer(text) if m.group(2) != statement_copy(m.group(1))}
    )


def latest_definitions() -> dict[str, tuple[str, str]]:
    """Function name -> (migration file, its newest definition's text)."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql")):
        for m in _FUNCTION_RE.finditer(path.read_text("utf-8")):
            found[m.group(1)] = (path.name, m.group(0))
    return found


def problems() -> list[str]:
    out = []
    for function, (source, text) in sorted(latest_definitions().items()):
        for name in stale(text):
            out.append(f"{source}: {function} holds an old copy of statement {name}")
    for name in stale(SCHEMA_SQL.read_text("utf-8")):
        out.append(f"schema.sql holds an old copy of statement {name}")
    return out


def new_migration(name: str) -> Path:
    versions = [int(p.name[:4]) for p in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql")]
    version = max(versions) + 1
    parts = []
    for function, (source, text) in sorted(latest_definitions().items()):
        if stale(text):
            body = text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
            parts.append(f"-- {function}, first defined in {source}, refreshed.\n{fill(body)}")
    if not parts:
        raise SystemExit("nothing to refresh: every copy equals its statement")
    path = MIGRATIONS / f"{version:04d}_{name}.sql"
    head = (
        f"-- Migration {version:04d}: the SQL API's copies of the client's statements "
        "refreshed (tools/sql_api_refresh.py --new).\n\n"
    )
    path.write_text(head + "\n".join(parts), "utf-8")
    SCHEMA_SQL.write_text(fill(SCHEMA_SQL.read_text("utf-8")), "utf-8")
    return path


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--fill":
        path = Path(argv[1])
        path.write_text(fill(path.read_text("utf-8")), "utf-8")
        return 0
    if len(argv) == 2 and argv[0] == "--new":
        print(new_migration(argv[1]))
        return 0
    if argv not in ([], ["--check"]):
        print("usage: sql_api_refresh.py [--check | --fill PATH | --new NAME]", file=sys.stderr)
        return 2
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print("run: python tools/sql_api_refresh.py --new sql_api_refresh", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
