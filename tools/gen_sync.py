"""Generate the sync client from the async one: ``leaseq/client_async.py`` gives
``leaseq/client.py`` and each ``leaseq/ops/X_async.py`` gives ``leaseq/ops/X.py``.

One source for both: the async files are the code we edit and review; this script removes
the async/await keywords and swaps the async names for their sync twins, keeping comments,
then formats the result with ruff (imports sorted, unused ones dropped), so the generated
files are linted like any other. Only I/O code is generated: pure code lives in modules
both sides import (``leaseq.params``, ``leaseq.rows``).
``python tools/gen_sync.py --check`` exits 1 when a generated file is out of date.
"""

from __future__ import annotations

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
# of an async source says "await" followed by a space).
REPLACEMENTS: list[tuple[str, str]] = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait asyncio\.to_thread\((\w+), ", r"\1("),
    (r"\bawait asyncio\.sleep\(", "time.sleep("),
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


def sources() -> list[Path]:
    return [
        ROOT / "leaseq" / "client_async.py",
        *sorted((ROOT / "leaseq" / "ops").glob("*_async.py")),
    ]


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
    body = re.sub(r'\A""".*?"""', "", text, count=1, flags=re.DOTALL)
    for pattern, replacement in REPLACEMENTS:
        body = re.sub(pattern, replacement, body, flags=re.MULTILINE)
    generated = HEADER.format(source=name) + _docstring(text, name) + body
    target = target_of(source)
    fixed = _ruff(["check", "--fix", "--exit-zero", "--select", "I,F401"], generated, target)
    return _ruff(["format"], fixed, target)


def main(argv: list[str]) -> int:
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
