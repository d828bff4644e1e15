"""Named SQL statements and migrations, rendered for one schema.

The text lives in ``queries.sql`` and ``migrations/NNNN_name.sql`` so it can be read and
reviewed as SQL. This module only parses those files and substitutes the schema name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from leaseq.codes import ErrorCode
from leaseq.errors import ConfigError

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_CODE_RE = re.compile(r"\{code:(\w+)\}")


def check_schema_name(schema: str) -> str:
    """Accept only plain lower-case identifiers, so quoting can never be bypassed."""
    if not isinstance(schema, str) or not _SCHEMA_RE.fullmatch(schema):
        raise ConfigError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and _ "
            "(at most 63 characters, not starting with a digit)"
        )
    return schema


def _render(text: str, schema: str) -> str:
    return text.replace("{schema}", '"' + check_schema_name(schema) + '"')


def _codes(text: str) -> str:
    """``{code:NAME}`` becomes the value of ``ErrorCode.NAME``; an unknown name fails at load."""

    def value(m: re.Match[str]) -> str:
        try:
            return ErrorCode[m.group(1)].value
        except KeyError:
            raise RuntimeError(f"queries.sql names unknown error code {m.group(1)}") from None

    return _CODE_RE.sub(value, text)


def _parse_queries(text: str) -> dict[str, str]:
    parts = _NAME_RE.split(_codes(text))
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"duplicate query name {name} in queries.sql")
        statement = "\n".join(
            line for line in body.strip().splitlines() if not line.startswith("--")
        ).strip()
        queries[name] = statement.rstrip(";")
    fragments = {name: text for name, text in queries.items() if name.startswith("_")}
    statements = {}
    for name, text in queries.items():
        if name.startswith("_"):
            continue
        for fragment, body in fragments.items():
            text = text.replace("{" + fragment + "}", body)
        if re.search(r"\{_\w+\}", text):
            raise RuntimeError(f"statement {name} uses an unknown fragment")
        statements[name] = text
    return statements


@cache
def _query_texts() -> dict[str, str]:
    text = resources.files("leaseq.sql").joinpath("queries.sql").read_text("utf-8")
    return _parse_queries(text)


class Queries:
    """The statements of ``queries.sql`` for one schema, looked up by name."""

    def __init__(self, schema: str) -> None:
        self.schema = check_schema_name(schema)
        self._rendered = {name: _render(t, schema) for name, t in _query_texts().items()}

    def __getitem__(self, name: str) -> str:
        return self._rendered[name]

    def names(self) -> list[str]:
        return sorted(self._rendered)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def _migration_texts() -> tuple[tuple[int, str, str], ...]:
    found = []
    for entry in resources.files("leaseq.sql").joinpath("migrations").iterdir():
        m = _MIGRATION_RE.match(entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    found.sort()
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return tuple(found)


def migrations(schema: str) -> list[Migration]:
    return [Migration(v, n, _render(t, schema)) for v, n, t in _migration_texts()]


def latest_version() -> int:
    return len(_migration_texts())
