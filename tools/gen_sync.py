"""Generate the sync client from the async one: each file of :data:`INPUTS`,
``X_async.py``, gives its twin ``X.py`` beside it (``leaseq/client_async.py`` gives
``leaseq/client.py``, ``leaseq/ops/lease_async.py`` gives ``leaseq/ops/lease.py``, ...).

One source for both: the async files are the code we edit and review; this script removes
the async/await keywords and swaps the async names for their sync twins, keeping comments,
then formats the result with ruff (imports sorted, unused ones dropped), so the generated
files are linted like any other. Only I/O code is generated: pure code lives in modules
both sides import (``leaseq.params``, ``leaseq.rows``).
``python tools/gen_sync.py --check`` exits 1 when a generated file is out of date.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEADER = (
    "# Generated from {source} by tools/gen_sync.py. Do not edit by hand:\n"
    "# change the async source and run `python tools/gen_sync.py`.\n"
)

# Applied in order, to the whole text (code, comments and docstrings alike: so no docstring
# of an async source may say "await" followed by a space; convert() refuses one that does).
REPLACEMENTS: list[tuple[str, str]] = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait asyncio\.to_thread\(([\w.]+), ", r"\1("),
    (r"\bawait asyncio\.sleep\(", "time.sleep("),
    # Awaitables run at once in async, one after the other in sync: the list comprehension
    # of calls is the list of their results there.
    (r"\bawait asyncio\.gather\(\*(\[[^\]]*\])\)", r"\1"),
    (r"\bawait ", ""),
    # AsyncConnectionPool, AsyncConnection, AsyncIterator, AsyncClient, AsyncLeaseOps, ...
    (r"\bAsync([A-Z]\w*)\b", r"\1"),
    # leaseq.client_async -> leaseq.client, leaseq.ops.lease_async -> leaseq.ops.lease
    (r"\b(leaseq(?:\.\w+)*?)_async\b", r"\1"),
    (r"\basyncio\.Lock\b", "threading.Lock"),
    # Whichever the sync code needs is kept; ruff drops the others.
    (r"^import asyncio$", "import threading\nimport time"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\bcontextlib\.asynccontextmanager\b", "contextlib.contextmanager"),
]


#: The async sources, listed (not globbed: where a file lives is a design choice, not the
#: generator's). A new ``*_async.py`` that is not listed here fails ``--check``.
INPUTS = (
    "leaseq/client_async.py",
    "leaseq/routed_async.py",
    "leaseq/ops/base_async.py",
    "leaseq/ops/reads_async.py",
    "leaseq/ops/ending_async.py",
    "leaseq/ops/payloads_async.py",
    "leaseq/ops/enqueue_async.py",
    "leaseq/ops/deps_async.py",
    "leaseq/ops/batches_async.py",
    "leaseq/ops/results_async.py",
    "leaseq/ops/lease_async.py",
    "leaseq/ops/failure_async.py",
    "leaseq/ops/inspect_async.py",
    "leaseq/ops/admin_async.py",
    "leaseq/ops/pauses_async.py",
    "leaseq/ops/schedules_async.py",
    "leaseq/ops/limits_async.py",
    "leaseq/ops/fair_async.py",
    "leaseq/ops/trace_async.py",
    "leaseq/ops/web_async.py",
    "leaseq/ops/steps_async.py",
    "leaseq/ops/tokens_async.py",
)


def sources() -> list[Path]:
    return [ROOT / name for name in INPUTS]


def unlisted() -> list[Path]:
    """Async sources in the package that :data:`INPUTS` does not name."""
    listed = set(sources())
    return sorted(p for p in (ROOT / "leaseq").rglob("*_async.py") if p not in listed)


def _docstrings_say_await(source: Path, text: str) -> list[int]:
    """Lines of docstrings that say "await " (the rules rewrite docstrings too, so such a
    word would silently change meaning in the twin)."""
    tree = ast.parse(text)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc and "await " in doc and node.body:
                lines.append(node.body[0].lineno)
    return lines


def target_of(source: Path) -> Path:
    return source.with_name(source.name.removesuffix("_async.py") + ".py")


def _docstring(text: str, source: str) -> str:
    """The twin's docstring: the source's first paragraph, converted, and where it is from."""
    match = re.match(r'\A"""(.*?)"""', text, flags=re.DOTALL)
    first = match.group(1).split("\n\n")[0].strip() if match else ""
    for pattern, replacement in REPLACEMENTS:
        first = re.sub(pattern, replacement, first)
    return f'"""{first}\n\nThe synchronous twin of ``{source}``; see that file for the logic.\n"""'


def _ruff(args: list[str], text: str, filename: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(filename), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"ruff {args[0]} failed on {filename}:\n{result.stderr}")
    return result.stdout


def convert(source: Path) -> str:
    text = source.read_text("utf-8")
    name = source.relative_to(ROOT).as_posix()
    bad = _docstrings_say_await(source, text)
    if bad:
        where = ", ".join(f"{name}:{line}" for line in bad)
        raise SystemExit(f"a docstring says 'await ' (the twin would lose the word): {where}")
    body = re.sub(r'\A""".*?"""', "", text, count=1, flags=re.DOTALL)
    for pattern, replacement in REPLACEMENTS:
        body = re.sub(pattern, replacement, body, flags=re.MULTILINE)
    generated = HEADER.format(source=name) + _docstring(text, name) + body
    target = target_of(source)
    fixed = _ruff(["check", "--fix", "--exit-zero", "--select", "I,F401"], generated, target)
    return _ruff(["format"], fixed, target)


def main(argv: list[str]) -> int:
    missing = unlisted()
    if missing:
        for path in missing:
            print(f"{path.relative_to(ROOT)} is not in tools/gen_sync.py's INPUTS")
        return 1
    stale = []
    for source in sources():
        target = target_of(source)
        generated = convert(source)
        if not target.exists() or target.read_text("utf-8") != generated:
            stale.append(target)
            if "--check" not in argv:
                target.write_text(generated, "utf-8")
    if stale and "--check" in argv:
        for target in stale:
            print(f"{target.relative_to(ROOT)} is out of date: run python tools/gen_sync.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
