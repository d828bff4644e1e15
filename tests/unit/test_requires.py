"""The "tool missing" rule of tests/support/requires.py: a developer's run skips the test,
a CI run (CI=true) fails it, so a broken install step cannot hide behind skips."""

from __future__ import annotations

import pathlib
import re

import pytest

from tests.support import requires

ABSENT = "leaseq-no-such-tool-7f3a"


def test_missing_tool_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{ABSENT} not installed"):
        requires.require(ABSENT)


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_missing_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match=f"{ABSENT} not installed.*CI=true"):
        requires.require(ABSENT)


@pytest.mark.parametrize("value", ["", "false", "0"])
def test_ci_set_to_false_still_skips(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception):
        requires.missing("no netns here")


def test_skip_reason_names_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(requires, "find_tool", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install iproute2"):
        requires.require("ip")


def test_present_tool_passes_and_has_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    requires.require("sh")
    assert requires.tool_path("sh").endswith("/sh")


def test_unmet_root_is_a_requirement_like_a_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requires.os, "geteuid", lambda: 1000)
    assert requires.unmet("root") == "needs root"
    monkeypatch.setattr(requires.os, "geteuid", lambda: 0)
    assert requires.unmet("root") is None


_MARKED = f"""
import pytest

@pytest.mark.requires("sh", "{ABSENT}")
def test_needs_a_missing_tool(needs_fixture):
    pass

@pytest.fixture
def needs_fixture():
    raise AssertionError("fixtures must not run when a requirement is missing")
"""

_CONFTEST = """
import pytest
from tests.support.requires import check_marks

def pytest_configure(config):
    config.addinivalue_line("markers", "requires(*names): needs")

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    check_marks(item)
"""


@pytest.mark.parametrize(("ci", "outcome"), [(None, "skipped"), ("true", "errors")])
def test_requires_marker_skips_or_fails_before_fixtures(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None, outcome: str
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(_MARKED)
    result = pytester.runpytest("-rs", "-p", "no:asyncio")
    result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines([f"*{ABSENT} not installed*"])
    result.stdout.no_fnmatch_line("*fixtures must not run*")


ROOT = pathlib.Path(__file__).resolve().parents[2]
_NAMED = re.compile(r"""(?:requires|require|tool_path)\(((?:\s*"[^"]+",?)+)\s*\)""")


def _required_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        if path.parent.name == "unit":
            continue  # the unit tests require made-up tools on purpose
        for match in _NAMED.finditer(path.read_text()):
            names.update(re.findall(r'"([^"]+)"', match.group(1)))
    return names


def test_ci_installs_every_program_a_test_requires() -> None:
    """A program the suite requires but `.ci/run` does not install would fail every CI run
    (or, before CI=true failed on it, pass as a silent skip)."""
    names = _required_names()
    scanned = {"pgbouncer", "ip", "root", "postgres-server", "patroni", "etcd"}
    assert scanned <= names  # the scan finds them
    (ci_tools,) = re.findall(r'^ci_tools="([^"]*)"$', (ROOT / ".ci/run").read_text(), re.M)
    installed = dict(entry.split(":", 1) for entry in ci_tools.split())
    programs = names - {"root", "postgres-server"}
    assert installed == {name: requires.DEBIAN_PACKAGES[name] for name in programs}
