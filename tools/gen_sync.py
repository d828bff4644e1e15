"""Generate the sync client (leaseq/client.py) from the async one (leaseq/client_async.py).

One source for both: the async file is the code we edit and review; this script removes
the async/await keywords and swaps the async classes for their sync twins, keeping
comments. `python tools/gen_sync.py --check` exits 1 when client.py is out of date.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "leaseq" / "client_async.py"
TARGET = ROOT / "leaseq" / "client.py"

HEADER = (
    "# Generated from leaseq/client_async.py by tools/gen_sync.py. Do not edit by hand:\n"
    "# change the async source and run `python tools/gen_sync.py`.\n"
)

# Order matters: longer names first so AsyncConnectionPool is not read as AsyncConnection.
REPLACEMENTS: list[tuple[str, str]] = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait asyncio\.to_thread\((\w+), ", r"\1("),
    (r"\bawait asyncio\.sleep\(", "time.sleep("),
    (r"\bawait ", ""),
    (r"\bAsyncConnectionPool\b", "ConnectionPool"),
    (r"\bAsyncConnection\b", "Connection"),
    (r"\bAsyncCursor\b", "Cursor"),
    (r"\bAsyncClient\b", "Client"),
    (r"\basyncio\.Lock\b", "threading.Lock"),
    (r"^import asyncio$", "import threading"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\bcontextlib\.asynccontextmanager\b", "contextlib.contextmanager"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"AsyncClient: enqueue", "Client: enqueue"),
]

SYNC_DOCSTRING = (
    '"""Client: the synchronous twin of AsyncClient, with the same methods and meanings.\n\n'
    "Generated from ``leaseq/client_async.py``; see that file for the logic.\n"
    '"""'
)


def convert(text: str) -> str:
    for pattern, replacement in REPLACEMENTS:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    # The source's module docstring speaks of the generation; the twin gets its own.
    text = re.sub(r'\A""".*?"""', lambda _: SYNC_DOCSTRING, text, count=1, flags=re.DOTALL)
    return HEADER + text


def main(argv: list[str]) -> int:
    generated = convert(SOURCE.read_text("utf-8"))
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text("utf-8") != generated:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python tools/gen_sync.py")
            return 1
        return 0
    TARGET.write_text(generated, "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
