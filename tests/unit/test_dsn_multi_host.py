"""A DSN naming several hosts must ask libpq for a writable server, or after a failover it
may settle on a read-only one: the check behind the once-per-DSN warning."""

from __future__ import annotations

import pytest

from leaseq.dsn import multi_host_problem


@pytest.mark.parametrize(
    "dsn",
    [
        "host=a port=5432 dbname=x",
        "postgresql://u@a:5432/x",
        "host=a,b port=1,2 dbname=x target_session_attrs=read-write",
        "host=a,b port=1,2 dbname=x target_session_attrs=primary",
        "postgresql://u@a:1,b:2/x?target_session_attrs=read-write",
    ],
)
def test_one_host_or_a_writable_target_is_fine(dsn: str) -> None:
    assert multi_host_problem(dsn) is None


@pytest.mark.parametrize(
    "dsn",
    [
        "host=a,b port=1,2 dbname=x",
        "host=a,b dbname=x target_session_attrs=any",
        "postgresql://u@a:1,b:2/x",
        "hostaddr=127.0.0.1,127.0.0.2 dbname=x target_session_attrs=prefer-standby",
    ],
)
def test_several_hosts_without_a_writable_target_are_named(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    problem = multi_host_problem(dsn)
    assert problem is not None and "target_session_attrs=read-write" in problem


def test_the_environment_can_ask_for_a_writable_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "read-write")
    assert multi_host_problem("host=a,b dbname=x") is None
