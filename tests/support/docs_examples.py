"""The examples of README.md and docs/*.md, as the docs test runs them (pure: no I/O but
reading the pages).

Every ```python and ```sh block of a page is one of:

- **not runnable**: the line just above its fence (blank lines aside) is, visibly,
  ``*Not runnable: REASON*`` (also ``*Not runnable as pasted: REASON*``). Counted; the
  count may only go down (:data:`CEILING_FILE`).
- **a file** of the page's example project: a python block whose first line is a comment
  naming a path (``# shop/jobs.py``, ``# manage.py``, ``# tests/test_signup.py``) is
  written there, in the page's project directory, when the test reaches it.
- **a snippet**: every other python block runs, in page order, in one interpreter per
  page (so later snippets see what earlier ones defined), in the project directory.
- **commands**: an sh block runs in bash (``set -e``), in the project directory, with the
  page's virtual environment first on PATH. ``pip install 'leaseq[EXTRA]' more...`` is
  how a page names what it needs: the test creates one environment per such line, from
  the checkout's wheel (non-editable), and the line itself is not run again.

Pages run in order of appearance; each page gets a fresh database, named by the usual
``PG*`` variables and ``LEASEQ_DSN``.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The checked-in ceiling of examples marked not runnable: lower it when you make one run.
CEILING_FILE = ROOT / "tests" / "support" / "docs_not_runnable.txt"

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^\*Not runnable(?: as pasted)?: (.+)\*$")
_FILE = re.compile(r"^# ((?:[\w.-]+/)*[\w.-]+\.(?:py|toml|cfg|ini|txt))\s*$")
_PIP = re.compile(r"^pip install (.+)$")

HOW_TO_FIX = (
    "Each ```python / ```sh example in README.md and docs/*.md runs in the docs test "
    "(tests/acceptance/test_docs_examples.py; what the forms mean: "
    "tests/support/docs_examples.py). To fix: make the example run as pasted (define what "
    "it uses, or start it with a '# path/file.py' line to make it a file of the page's "
    "example project), or, if it cannot run alone, put the line "
    "'*Not runnable: <the reason>*' just above its fence (then raise the count in "
    "tests/support/docs_not_runnable.txt only if you must: it may only go down)."
)


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str  # python or sh
    code: str
    not_runnable: str | None  # the reason, when marked
    path: str | None  # a file of the example project, for python blocks naming one

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def requirements(self) -> tuple[str, ...] | None:
        """What a ``pip install ...`` line of this sh block names (its first such line)."""
        if self.lang != "sh":
            return None
        for line in self.code.splitlines():
            found = _PIP.match(line.split("#", 1)[0].strip())
            if found:
                return tuple(shlex.split(found.group(1)))
        return None


def _counts(line: str) -> bool:
    """A line the marker search looks at: not blank, not a one-line HTML comment (the
    README's ``<!-- command:... -->`` markers sit between a mark and its fence)."""
    text = line.strip()
    return bool(text) and not (text.startswith("<!--") and text.endswith("-->"))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    lines = page.read_text("utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        lang = {"py": "python", "bash": "sh", "shell": "sh"}.get(fence.group(1), fence.group(1))
        if lang in ("python", "sh"):
            body = lines[i + 1 : end]
            above = next((lines[k] for k in range(i - 1, -1, -1) if _counts(lines[k])), "")
            mark = _MARK.match(above.strip())
            named = _FILE.match(body[0]) if body and lang == "python" else None
            found.append(
                Block(
                    page=page,
                    line=i + 1,
                    lang=lang,
                    code="\n".join(body) + "\n",
                    not_runnable=mark.group(1) if mark else None,
                    path=named.group(1) if named else None,
                )
            )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


def ceiling() -> int:
    return int(CEILING_FILE.read_text("utf-8").split()[0])


def wheel_requirements(requirements: tuple[str, ...], wheel: Path) -> list[str]:
    """A page's ``pip install`` arguments with ``leaseq`` / ``leaseq[EXTRA]`` replaced by
    the checkout's wheel (with the same extras): what the test installs instead."""
    out = []
    for req in requirements:
        named = re.fullmatch(r"leaseq(\[[\w,]+\])?", req)
        out.append(f"{wheel}{named.group(1) or ''}" if named else req)
    return out


def without_pip_lines(code: str) -> str:
    """An sh block without its ``pip install`` lines (the test made that environment)."""
    kept = [line for line in code.splitlines() if not _PIP.match(line.split("#", 1)[0].strip())]
    return "\n".join(kept) + "\n"
