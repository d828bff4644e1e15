"""The unit layer: pure code only. A unit test that asks for a database fixture fails
(``tests.support.layers``)."""

from __future__ import annotations

import pytest

from tests.support.layers import refuse_database_fixtures


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    refuse_database_fixtures(item)
