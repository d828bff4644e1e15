"""Typed payloads (issue 30): a task is a ``Task[P]`` of its handler's payload type, so mypy
(strict, as CI runs it) checks ``task.enqueue(payload)`` against the handler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """\
from typing import Any, TypedDict

import leaseq

app = leaseq.App()


class Receipt(TypedDict):
    order: int
    email: str


@app.task
def bare(ctx: leaseq.JobContext, payload: Receipt) -> None: ...


@app.task(name="mail.receipt", queue="mail")
def named(ctx: leaseq.JobContext, payload: Receipt) -> None: ...


@app.task(name="anything")
def loose(ctx: leaseq.JobContext, payload: Any) -> None: ...


bare.enqueue({"order": 7, "email": "a@example.com"})
named.enqueue({"order": "7", "email": "a@example.com"})
bare.enqueue({"order": 7})
named.sig({"order": 7, "email": "a@example.com"}, delay=5)
loose.enqueue(["whatever", 1])
reveal_type(named)
"""


def test_mypy_checks_an_enqueued_payload_against_the_handler(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    snippet = tmp_path / "typed.py"
    snippet.write_text(SNIPPET)
    # In a process of its own: mypy raises the recursion limit of the process it runs in.
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--follow-imports=silent", "--no-error-summary", str(snippet)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    out = done.stdout
    lines = SNIPPET.splitlines()
    errors = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    wrong = {lines.index('named.enqueue({"order": "7", "email": "a@example.com"})') + 1,
             lines.index('bare.enqueue({"order": 7})') + 1}  # fmt: skip
    assert errors == wrong, out  # a str for an int; a missing key; nothing else
    (revealed,) = [line for line in out.splitlines() if "Revealed type" in line]
    assert "leaseq.app.Task[" in revealed and "Receipt" in revealed, out
