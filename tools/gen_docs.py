"""Generate docs/metrics.md from the METRICS table in leaseq/metrics.py.

The table in ``leaseq.metrics.METRICS`` is the one list of what leaseq exports; the page is
written from it so the two cannot drift. ``python tools/gen_docs.py`` rewrites the page;
``python tools/gen_docs.py --check`` exits 1 when it is out of date (a unit test runs that).
"""

from __future__ import annotations

import sys
from pathlib import Path

from leaseq.metrics import MAX_ERROR_CODES, METRICS, MetricSpec

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "metrics.md"

HEADER = """\
<!-- Generated from leaseq/metrics.py (METRICS) by tools/gen_docs.py. Do not edit by hand:
change the table there and run `python tools/gen_docs.py`. -->

# Metrics

leaseq exports Prometheus metrics from two places:

- **Worker metrics** describe what one worker process did (transitions, latencies, lost
  fences). Each worker serves its own with `leaseq worker --metrics-port 9100`, together with
  `/healthz` (alive) and `/readyz` (503 while the database is unreachable); use
  `--metrics-host 0.0.0.0` in containers.
- **Database metrics** describe the queue itself (ages, counts, dead jobs). They are served
  once, by `leaseq metrics serve --port 9464`, computed on each scrape by indexed queries
  (safe every 15 s on a large backlog).

The format is Prometheus text. Labels stay bounded: queue names (a deployment's own, few),
outcomes, at most {max_codes} distinct error codes (the rest as `other`), attempt numbers 1 to 5
then `6+`; never job ids. Histograms also export `_bucket`, `_sum` and `_count` series.
`leaseq metrics list` prints this table (`--json` for a machine-readable copy). The alert
rules built on these metrics are described in [operations](operations.md#alerts).

| metric | type | labels | from | meaning |
|---|---|---|---|---|
"""


def _row(spec: MetricSpec) -> str:
    labels = ", ".join(spec.labels) or "—"
    return f"| `{spec.name}` | {spec.kind} | {labels} | {spec.source} | {spec.help} |"


def render() -> str:
    """The whole page, as it must be on disk."""
    rows = "\n".join(_row(spec) for spec in METRICS)
    return HEADER.format(max_codes=MAX_ERROR_CODES) + rows + "\n"


def main(argv: list[str]) -> int:
    page = render()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text("utf-8") != page:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python tools/gen_docs.py")
            return 1
        return 0
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(page, "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
