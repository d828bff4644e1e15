"""What a test needs from the machine (a program, root, PostgreSQL server binaries), and
what happens when it is missing: a skip on a developer's machine, a failure under
``CI=true``, so a broken install step in CI can never turn a suite into silent skips.

Use the marker, ``@pytest.mark.requires("pgbouncer")`` (checked by ``tests/conftest.py``
before the test's fixtures are set up), or call :func:`require` / :func:`tool_path` /
:func:`missing` inside a fixture when the need is only known at run time.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import NoReturn

import pytest

from leaseq.dev.embedded import find_bindir
from leaseq.errors import EmbeddedError

#: The Debian package of each program a test requires, named in the skip reason so a
#: newcomer knows the fix. A new tool (faketime, chromium, etcd, ...) goes here and into
#: `ci_tools` in `.ci/run`; tests/unit/test_requires.py checks the two agree.
DEBIAN_PACKAGES = {
    "pgbouncer": "pgbouncer",
    "ip": "iproute2",
    # The dashboard's browser test (tests/acceptance/test_web_browser.py), driven by
    # Playwright pointed at this browser (never `playwright install`).
    "chromium": "chromium",
    # The Patroni cluster of the failover tests (tests/support/patroni.py).
    "patroni": "patroni",
    "etcd": "etcd-server",
    # The Node.js client's suite (tests/integration/test_node_client.py, clients/node).
    "node": "nodejs",
    "npm": "npm",
}
# Debian puts daemons and `ip` in sbin, which a non-root PATH often lacks.
_SBIN = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin"])


def in_ci() -> bool:
    """True when the run is CI's (``CI`` set to true, 1 or yes, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing(reason: str) -> NoReturn:
    """Skip the current test, or fail it under CI, because ``reason`` is not met."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing requirement fails, not skips)", pytrace=False)
    pytest.skip(reason)


def find_tool(name: str) -> str | None:
    """The path of the executable ``name`` on PATH or in the sbin directories, else None."""
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def _postgres_server() -> str | None:
    # The embedded-server tests clear LEASEQ_PG_BINDIR, so only an installed server counts.
    saved = os.environ.pop("LEASEQ_PG_BINDIR", None)
    try:
        find_bindir()
    except EmbeddedError:
        return "PostgreSQL server binaries missing (run scripts/ensure-postgres)"
    finally:
        if saved is not None:
            os.environ["LEASEQ_PG_BINDIR"] = saved
    return None


def _root() -> str | None:
    return None if os.geteuid() == 0 else "needs root"


#: Named needs that are not a program on PATH.
_SPECIAL: dict[str, Callable[[], str | None]] = {
    "postgres-server": _postgres_server,
    "root": _root,
}


def unmet(name: str) -> str | None:
    """Why the requirement ``name`` is not met on this machine, or None when it is."""
    special = _SPECIAL.get(name)
    if special is not None:
        return special()
    if find_tool(name) is not None:
        return None
    package = DEBIAN_PACKAGES.get(name, name)
    return f"{name} not installed (Debian: apt-get install {package})"


def require(*names: str) -> None:
    """Skip (or under CI fail) the current test unless every named requirement is met."""
    for name in names:
        reason = unmet(name)
        if reason is not None:
            missing(reason)


def tool_path(name: str) -> str:
    """The path of the program ``name``; skips (or under CI fails) the test without it."""
    require(name)
    path = find_tool(name)
    assert path is not None
    return path


def check_marks(item: pytest.Item) -> None:
    """Apply every ``@pytest.mark.requires(...)`` on ``item`` (called at test setup)."""
    for mark in item.iter_markers("requires"):
        require(*mark.args)
