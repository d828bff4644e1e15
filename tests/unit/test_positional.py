"""leaseq.ops.positional: named placeholders to PostgreSQL's $N, as psycopg would send them."""

from __future__ import annotations

import pytest

from leaseq.ops.positional import positional, values
from leaseq.sql import Queries


def test_names_become_numbers_in_first_use_order_and_a_repeat_keeps_its_number() -> None:
    text, names = positional("SELECT %(b)s, %(a)s, %(b)s::int, 5 %% 2")
    assert text == "SELECT $1, $2, $1::int, 5 % 2"
    assert names == ("b", "a")
    assert values(names, {"a": 1, "b": 2, "unused": 3}) == [2, 1]


def test_a_missing_parameter_is_named() -> None:
    _, names = positional("SELECT %(gone)s")
    with pytest.raises(KeyError, match="gone"):
        values(names, {})


def test_every_long_statement_converts_to_what_psycopg_makes_of_it() -> None:
    # The statements that take the raw path: psycopg's own conversion is the reference.
    from psycopg._queries import PostgresQuery
    from psycopg.adapt import Transformer

    queries = Queries("s_positional")
    long_ones = [n for n in queries.names() if len(queries[n].encode()) > 4096]
    assert "claim_jobs" in long_ones
    for name in long_ones:
        text, names = positional(queries[name])
        params = {n: None for n in names}
        pq = PostgresQuery(Transformer())
        pq.convert(queries[name], params)
        assert text.encode() == pq.query, name
