"""CONTRIBUTING.md's layout block against the tree: every path it names exists, and every
hand-written module of a folder whose files it lists is named (generated twins and package
``__init__.py`` files aside), so the block cannot drift from the code again."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PATHLIKE = re.compile(r"^[\w.*-]+/?$")


def _layout_block() -> list[str]:
    text = (ROOT / "CONTRIBUTING.md").read_text("utf-8")
    section = text[text.index("## Layout") :]
    block = section[section.index("```\n") + 4 :]
    return block[: block.index("```")].splitlines()


def _entries(lines: list[str]) -> list[tuple[int, str]]:
    """(indent, name) of each path the block names; continuation lines are left out."""
    found = []
    for line in lines:
        stripped = line.lstrip()
        if not stripped:
            continue
        indent = len(line) - len(stripped)
        head = re.split(r"\s{2,}", stripped, maxsplit=1)[0]
        names = [part.split()[0] for part in head.split(", ") if part.split()]
        paths = [n for n in names if _PATHLIKE.match(n) and ("." in n or n.endswith("/"))]
        if paths and paths[0] == names[0]:
            found += [(indent, n) for n in paths]
    return found


def _named_paths() -> tuple[set[Path], set[Path]]:
    """The files and the folders the block names (folders: those with children named)."""
    stack: list[tuple[int, Path]] = []
    files: set[Path] = set()
    listed_dirs: set[Path] = set()
    for indent, name in _entries(_layout_block()):
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ROOT
        if stack:
            listed_dirs.add(parent)
        path = parent / name.rstrip("/")
        if name.endswith("/"):
            stack.append((indent, path))
        elif "*" not in name:
            files.add(path)
    return files, listed_dirs


def _generated(path: Path) -> bool:
    return path.read_text("utf-8").startswith("# Generated from")


def test_every_path_the_layout_names_exists() -> None:
    files, dirs = _named_paths()
    assert len(files) > 80, "the parser found too little: it is broken"
    missing = sorted(str(p.relative_to(ROOT)) for p in files | dirs if not p.exists())
    assert not missing, f"CONTRIBUTING.md's layout names what is not there: {missing}"


def test_every_module_of_a_listed_folder_is_named() -> None:
    files, dirs = _named_paths()
    unnamed = []
    for folder in dirs:
        if not (folder == ROOT / "leaseq" or (ROOT / "leaseq") in folder.parents):
            continue
        for module in folder.glob("*.py"):
            if module in files or _generated(module):
                continue
            if module.name == "__init__.py" and folder != ROOT / "leaseq":
                continue
            unnamed.append(str(module.relative_to(ROOT)))
    assert not unnamed, f"add these to CONTRIBUTING.md's layout block: {sorted(unnamed)}"
