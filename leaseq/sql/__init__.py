"""Named SQL statements and migrations, rendered for one schema.

The text lives in ``queries/*.sql`` (one file per section, read in name order into one
namespace: names are unique across the files, fragments are shared by all of them) and
``migrations/NNNN_name.sql``, so it can be read and reviewed as SQL. This module only
parses those files, expands fragments and error codes, and substitutes the schema name.
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
_FRAGMENT_RE = re.compile(r"\{(_\w+)\}")


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
            raise RuntimeError(f"the SQL names unknown error code {m.group(1)}") from None

    return _CODE_RE.sub(value, text)


def _blocks(text: str, source: str) -> dict[str, str]:
    """The named blocks of one file: name -> text without its comment lines."""
    parts = _NAME_RE.split(_codes(text))
    # parts = [preamble, name1, body1, name2, body2, ...]
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise RuntimeError(f"duplicate query name {name} in {source}")
        statement = "\n".join(
            line for line in body.strip().splitlines() if not line.startswith("--")
        ).strip()
        blocks[name] = statement.rstrip(";")
    return blocks


def _expand(name: str, text: str, fragments: dict[str, str], seen: tuple[str, ...]) -> str:
    """``{_fragment}`` replaced by the fragment's text, fragments inside it too (in any
    order of definition); an unknown fragment or one that includes itself fails at load."""

    def body(m: re.Match[str]) -> str:
        fragment = m.group(1)
        if fragment not in fragments:
            raise RuntimeError(f"statement {name} uses an unknown fragment {fragment}")
        if fragment in seen:
            raise RuntimeError(f"fragment {fragment} includes itself ({' > '.join(seen)})")
        return _expand(name, fragments[fragment], fragments, (*seen, fragment))

    return _FRAGMENT_RE.sub(body, text)


def _parse_queries(files: dict[str, str]) -> dict[str, str]:
    """The statements of several files (file name -> text), fragments expanded."""
    blocks: dict[str, str] = {}
    where: dict[str, str] = {}
    for source, text in sorted(files.items()):
        for name, body in _blocks(text, source).items():
            if name in blocks:
                raise RuntimeError(f"duplicate query name {name} in {where[name]} and {source}")
            blocks[name], where[name] = body, source
    fragments = {name: text for name, text in blocks.items() if name.startswith("_")}
    return {
        name: _expand(name, text, fragments, ())
        for name, text in blocks.items()
        if not name.startswith("_")
    }


def query_files() -> dict[str, str]:
    """The text of every file of ``queries/``, by file name."""
    folder = resources.files("leaseq.sql").joinpath("queries")
    return {
        entry.name: entry.read_text("utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    }


@cache
def _query_texts() -> dict[str, str]:
    return _parse_queries(query_files())


class Queries:
    """The statements of ``queries/*.sql`` for one schema, looked up by name."""

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
