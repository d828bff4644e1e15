"""The test layers' rules: a unit test runs without a database.

``tests/unit/conftest.py`` applies :func:`refuse_database_fixtures` to every unit test, so a
test that asks for the session's server, a schema or a client fails at once with a line that
says where it belongs, instead of quietly turning the unit layer into an integration one.
"""

from __future__ import annotations

import pytest

#: Fixtures that reach PostgreSQL (tests/conftest.py and leaseq's own pytest plugin).
DATABASE_FIXTURES = frozenset(
    {
        "dsn",
        "schema",
        "client",
        "aclient",
        "conn",
        "leaseq_server_dsn",
        "leaseq_template",
        "leaseq_dsn",
        "leaseq_client",
        "leaseq_clock",
        "leaseq_testing",
    }
)


def database_fixtures_of(item: pytest.Item) -> list[str]:
    """The database fixtures ``item`` asks for (a parametrized argument of the same name is
    only a value, not the fixture)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    names = getattr(item, "fixturenames", ())
    return sorted(n for n in names if n in DATABASE_FIXTURES and n not in params)


def refuse_database_fixtures(item: pytest.Item) -> None:
    found = database_fixtures_of(item)
    if found:
        pytest.fail(
            f"{item.nodeid}: a unit test runs without a database, but asks for "
            f"{', '.join(found)}; move it to tests/integration",
            pytrace=False,
        )
