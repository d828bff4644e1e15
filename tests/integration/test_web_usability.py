"""The dashboard's usability fixes (issue 29) on a real PostgreSQL: the dead list pages on,
jobs waiting on dependencies are shown and counted as such, long errors and tracebacks are
kept whole (wrapping is the stylesheet's: the browser test measures the page width), and a
schedule's times are shown in its own time zone."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import leaseq
from tests.integration.test_web_routes import HEADERS, _app, _dead


@pytest.fixture()
def web(dsn: str, schema: str, client: leaseq.Client) -> Iterator[TestClient]:
    with TestClient(_app(dsn, schema), headers=HEADERS) as tc:
        yield tc


def _ids(page: str) -> list[int]:
    return [int(x) for x in re.findall(r'href="/jobs/(\d+)"', page)]


def test_the_dead_list_pages_through_every_dead_job(web: TestClient, client: leaseq.Client) -> None:
    dead = sorted((_dead(client, queue="d") for _ in range(120)), reverse=True)
    seen: list[int] = []
    path = "/dead?queue=d"
    for _ in range(5):
        page = web.get(path)
        assert page.status_code == 200
        seen += _ids(page.text)
        found = re.search(r'rel="next" href="([^"]+)"', page.text)
        if found is None:
            break
        path = found.group(1).replace("&amp;", "&")
    assert seen == dead  # every one, newest first, none twice
    assert "120</b> dead jobs" in web.get("/dead?queue=d").text
    assert web.get("/dead?before=abc").status_code == 400


def test_jobs_waiting_on_dependencies_are_shown_and_counted(
    web: TestClient, client: leaseq.Client
) -> None:
    parent = int(client.enqueue("t", {}, queue="flow"))
    child = int(client.enqueue("t", {}, queue="flow", depends_on=[parent]))
    page = web.get(f"/jobs/{child}").text
    assert "waiting on dependencies" in page and "when its dependencies end" in page
    assert "waiting on dependencies" not in web.get(f"/jobs/{parent}").text
    overview = web.get("/partials/overview").text
    row = re.search(r"flow</a>.*?</tr>", overview, re.S)
    assert row is not None
    # Ready 1 (the parent), scheduled 0, waiting 1 (the child).
    assert re.findall(r'<td class="n">(\d+)</td>', row.group(0))[:3] == ["1", "0", "1"]


def test_long_errors_and_tracebacks_keep_their_text_and_line_breaks(
    web: TestClient, client: leaseq.Client
) -> None:
    job = int(client.enqueue("t", {}))
    (lease,) = client.claim("default", worker="w")
    traceback = (
        'Traceback (most recent call last):\n  File "h.py", line 3\nValueError: ' + "x" * 3000
    )
    assert client.fail(lease, "BOOM", retryable=False, detail=traceback)
    page = web.get(f"/jobs/{job}").text
    assert '<pre class="detail">Traceback (most recent call last):\n  File' in page
    assert "x" * 3000 in page
    css = web.get("/static/style.css").text
    assert "white-space: pre-wrap" in css and "overflow-wrap: anywhere" in css


def test_schedule_times_are_shown_in_the_schedules_time_zone(
    web: TestClient, client: leaseq.Client
) -> None:
    client.schedule_add("berlin", task="t", cron="0 3 * * *", tz="Europe/Berlin", reason="x")
    client.schedule_add("every", task="t", every=3600, reason="x")
    page = web.get("/schedules").text
    row = re.search(r"<td>berlin</td>.*?</tr>", page, re.S)
    assert row is not None
    assert re.search(r"\d{4}-\d\d-\d\d 03:00:00 CES?T", row.group(0)), row.group(0)
    every = re.search(r"<td>every</td>.*?</tr>", page, re.S)
    assert every is not None and " UTC" in every.group(0)
