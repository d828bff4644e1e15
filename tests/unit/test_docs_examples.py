"""The docs test's bookkeeping, without running anything (the running is
tests/acceptance/test_docs_examples.py): how the examples are read, and the ratchet on the
examples marked not runnable, which may only go down."""

from __future__ import annotations

from pathlib import Path

from tests.support.docs_examples import (
    CEILING_FILE,
    HOW_TO_FIX,
    all_blocks,
    blocks,
    ceiling,
    wheel_requirements,
    without_pip_lines,
)


def test_the_examples_marked_not_runnable_never_grow_in_number() -> None:
    marked = [b for b in all_blocks() if b.not_runnable is not None]
    listed = "\n".join(f"  {b.where}: {b.not_runnable}" for b in marked)
    assert len(marked) <= ceiling(), (
        f"{len(marked)} examples are marked not runnable, more than the "
        f"{ceiling()} of {CEILING_FILE.name}:\n{listed}\n{HOW_TO_FIX}"
    )
    assert len(marked) == ceiling(), (
        f"only {len(marked)} examples are marked not runnable now: lower the count in "
        f"{CEILING_FILE} to {len(marked)} (it may only go down)"
    )


def test_every_mark_gives_a_reason() -> None:
    for block in all_blocks():
        assert block.not_runnable is None or len(block.not_runnable.strip()) > 5, block.where


def test_the_forms_of_an_example(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n*Not runnable: it needs your bucket.*\n\n```python\nstore()\n```\n\n"
        "```sh\npip install 'leaseq[django]' pytest  # the page's own\nleaseq status\n```\n\n"
        "```python\n# shop/jobs.py\nimport leaseq\n```\n\n"
        "<!-- command:demo -->\n```py\nx = 1\n```\n\n```json\n{}\n```\n",
        "utf-8",
    )
    marked, commands, project_file, snippet = blocks(page)
    assert marked.not_runnable == "it needs your bucket." and marked.line == 5
    assert commands.requirements == ("leaseq[django]", "pytest")
    assert without_pip_lines(commands.code) == "leaseq status\n"
    assert (project_file.path, project_file.not_runnable) == ("shop/jobs.py", None)
    assert (snippet.lang, snippet.path, snippet.not_runnable) == ("python", None, None)
    wheel = Path("/dist/leaseq-0.1.0-py3-none-any.whl")
    assert wheel_requirements(commands.requirements or (), wheel) == [f"{wheel}[django]", "pytest"]
