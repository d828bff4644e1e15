"""The documentation against the code: the generated metrics page is current, every metric
is documented, links between the pages resolve, and the README keeps the two set-up commands
that `.ci/run` reads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from leaseq.metrics import METRICS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_metrics_page_is_generated_from_the_metrics_table() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_metric_has_a_row_on_the_metrics_page() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text("utf-8")
    missing = [m.name for m in METRICS if f"| `{m.name}` |" not in page]
    assert not missing, f"docs/metrics.md lacks: {missing}"


def test_stale_metrics_page_is_detected(tmp_path: Path) -> None:
    """The check itself: a page that lost a row is reported, and nothing is rewritten."""
    page = ROOT / "docs" / "metrics.md"
    text = page.read_text("utf-8")
    broken = text.replace(f"| `{METRICS[0].name}` |", "| `renamed` |")
    assert broken != text
    script = (ROOT / "tools" / "gen_docs.py").read_text("utf-8")
    copy = tmp_path / "tools" / "gen_docs.py"
    copy.parent.mkdir()
    copy.write_text(script, "utf-8")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "metrics.md").write_text(broken, "utf-8")
    result = subprocess.run(
        [sys.executable, str(copy), "--check"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 1
    assert "out of date" in result.stdout
    assert (tmp_path / "docs" / "metrics.md").read_text("utf-8") == broken


def test_relative_links_between_pages_resolve() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text("utf-8")):
            if "://" in target or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_links_to_sections_name_existing_headings() -> None:
    def anchors(page: Path) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", page.read_text("utf-8"), re.MULTILINE)
        return {
            re.sub(r"[^\w\- ]", "", h.strip().lower().replace("`", "")).replace(" ", "-")
            for h in headings
        }

    broken = []
    for page in PAGES:
        for path, anchor in re.findall(r"\]\(([\w\-./]+\.md)#([\w\-]+)\)", page.read_text()):
            if anchor not in anchors(page.parent / path):
                broken.append(f"{page.relative_to(ROOT)}: {path}#{anchor}")
    assert not broken, broken


def test_readme_keeps_the_two_setup_commands_for_ci() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    for marker, command_tail in (
        ("demo", ".venv/bin/leaseq demo"),
        ("test", ".venv/bin/python -m pytest -n 4 --dist loadfile"),
    ):
        m = re.search(rf"^<!-- command:{marker} -->\n```sh\n(.+)\n```$", readme, re.MULTILINE)
        assert m, f"README lost the command:{marker} marker or its sh fence"
        assert m.group(1).startswith("sh scripts/ensure-postgres && ")
        assert m.group(1).endswith(command_tail)
