"""Pure: a named-placeholder statement (``%(name)s``, ``%%``) turned into PostgreSQL's own
positional form (``$1``), once per statement text.

psycopg parses every statement's placeholders again at each execution unless the text is
at most 4,096 bytes (its cache's limit); leaseq's claim statements are 6-13 KB, so each
claim re-ran that parse (about 5% of a drain's worker CPU by py-spy). ``run_statement``
(``leaseq.ops.reads_async``) sends such a statement through a raw cursor instead, with the
text this module made once and the values in its order.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

#: Longer statement texts than this are not kept in psycopg's placeholder cache.
LONG_STATEMENT = 4096

_PLACEHOLDER = re.compile(r"%(?:\((\w+)\)s|%)")


@functools.lru_cache(maxsize=256)
def positional(query: str) -> tuple[str, tuple[str, ...]]:
    """``(text with $N, the parameter names in $N order)``; a name used twice is one $N."""
    names: dict[str, int] = {}

    def place(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:
            return "%"
        if name not in names:
            names[name] = len(names) + 1
        return f"${names[name]}"

    text = _PLACEHOLDER.sub(place, query)
    return text, tuple(names)


def values(names: tuple[str, ...], params: Mapping[str, Any]) -> list[Any]:
    """The parameters in ``$N`` order (a missing one is a KeyError naming it, as psycopg's)."""
    return [params[name] for name in names]
