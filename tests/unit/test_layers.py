"""The unit layer's guard: a unit test asking for the database fails; one that only takes a
parameter of the same name does not."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_a_unit_test_asking_for_a_database_fixture_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
import pytest
from tests.support.layers import refuse_database_fixtures

@pytest.fixture()
def dsn():
    raise AssertionError("the guard must stop the test before this fixture runs")

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    refuse_database_fixtures(item)
"""
    )
    pytester.makepyfile(
        """
import pytest

def test_wants_the_server(dsn):
    pass

@pytest.mark.parametrize("dsn", ["postgresql://x"])
def test_only_a_value_named_dsn(dsn):
    assert dsn
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:leaseq")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*a unit test runs without a database, but asks for dsn*"])
