"""`leaseq worker --processes N` children: whatever spelling or environment asked for N
processes, a child's own command line must resolve to exactly one, or every child becomes
a supervisor in turn and the processes multiply without limit."""

from __future__ import annotations

import pytest

from leaseq.cli.worker import child_argv, worker

APP = "tests.support.apps.basic:app"

SPELLINGS = [
    ["-p2"],
    ["-p", "2"],
    ["--burst", "-p2", "-q", "default"],
    ["-c4", "-p2"],
    ["--processes=2"],
    ["--processes", "2"],
    ["-p", "2", "--processes=3"],
]


@pytest.mark.parametrize("args", SPELLINGS)
def test_child_command_line_asks_for_one_process(args: list[str]) -> None:
    parent = worker.make_context("worker", [APP, *args])
    assert parent.params["processes"] > 1, "the spelling itself must ask for several"
    child = worker.make_context("worker", child_argv([APP, *args]))
    assert child.params["processes"] == 1


@pytest.mark.parametrize("args", [[], ["-p2"]])
def test_command_line_of_child_beats_inherited_environment(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.setenv("LEASEQ_WORKER_PROCESSES", "2")
    assert worker.make_context("worker", [APP, *args]).params["processes"] == 2
    child = worker.make_context("worker", child_argv([APP, *args]))
    assert child.params["processes"] == 1


def test_child_keeps_every_other_setting() -> None:
    args = [APP, "-c", "3", "-p", "2", "--queue", "a", "--burst", "--retention", "never"]
    parent = worker.make_context("worker", list(args)).params
    child = worker.make_context("worker", child_argv(list(args))).params
    assert {**parent, "processes": 1} == child
