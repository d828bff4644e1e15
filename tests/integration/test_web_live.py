"""The job list and the dead list refresh live (issue 29) on a real PostgreSQL: both pages
mark their counts and table as live parts, a live refresh (live.js fetches the page's own
URL) keeps the filters and the keyset page, and skips the filter suggestions it does not
replace; the task and error code filters suggest the newest jobs' values, from a bounded
window (the browser test checks the held selection and the pause)."""

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

LIVE = {"X-Leaseq-Live": "1"}


@pytest.fixture()
def web(dsn: str, schema: str, client: leaseq.Client) -> Iterator[TestClient]:
    with TestClient(_app(dsn, schema), headers=HEADERS) as tc:
        yield tc


def _ids(page: str) -> list[int]:
    return [int(x) for x in re.findall(r'href="/jobs/(\d+)"', page)]


def _live(page: str, part: str) -> str:
    """The live part with this id (what live.js replaces)."""
    found = re.search(rf'<(\w+)[^>]*\bid="{part}"[^>]*\bdata-live[^>]*>(.*?)</\1>', page, re.S)
    assert found is not None, f"no live part {part}"
    return found.group(2)


def _options(page: str, datalist: str) -> list[str]:
    found = re.search(rf'<datalist id="{datalist}">(.*?)</datalist>', page, re.S)
    assert found is not None, f"no datalist {datalist}"
    return re.findall(r'<option value="([^"]*)">', found.group(1))


def test_job_list_live_refresh_keeps_filters_and_page(
    web: TestClient, client: leaseq.Client
) -> None:
    ids = [int(client.enqueue("t", {}, queue="lv")) for _ in range(60)]
    client.enqueue("t", {}, queue="other")
    first = web.get("/jobs?queue=lv")
    assert _ids(_live(first.text, "live")) == sorted(ids, reverse=True)[:50]
    assert "pending" in _live(first.text, "live-counts")
    nxt = re.search(r'rel="next" href="([^"]+)"', first.text)
    assert nxt is not None
    path = nxt.group(1).replace("&amp;", "&")
    assert "queue=lv" in path and "before=" in path
    # The refresh of page 2 (its own URL): the same filter and keyset page, fresh rows.
    client.enqueue("t", {}, queue="lv")
    live = web.get(path, headers=LIVE)
    assert live.status_code == 200
    assert _ids(_live(live.text, "live")) == sorted(ids, reverse=True)[50:]
    # A row of page 2 that changed state shows so on the next refresh.
    client.cancel(ids[0], reason="gone", actor="test")
    row = re.search(rf'href="/jobs/{ids[0]}".*?</tr>', web.get(path, headers=LIVE).text, re.S)
    assert row is not None and "cancelled" in row.group(0)
    # The checkboxes of the bulk selection are inside the live part (live.js holds the
    # refresh while any is checked).
    assert 'name="ids"' in _live(first.text, "live")


def test_dead_list_live_refresh_keeps_filters_and_page(
    web: TestClient, client: leaseq.Client
) -> None:
    dead = sorted((_dead(client, queue="dl") for _ in range(55)), reverse=True)
    _dead(client, queue="dl-other")
    first = web.get("/dead?queue=dl").text
    assert "55</b> dead jobs" in _live(first, "live-count")
    assert _ids(_live(first, "live")) == dead[:50]
    nxt = re.search(r'rel="next" href="([^"]+)"', first)
    assert nxt is not None
    path = nxt.group(1).replace("&amp;", "&")
    newer = _dead(client, queue="dl")
    live = web.get(path, headers=LIVE).text
    assert _ids(_live(live, "live")) == dead[50:]  # the same page, not the newest
    assert "56</b> dead jobs" in _live(live, "live-count")
    assert newer in _ids(_live(web.get("/dead?queue=dl", headers=LIVE).text, "live"))


def test_task_and_error_code_filters_suggest_the_newest_jobs_values(
    web: TestClient, client: leaseq.Client
) -> None:
    client.enqueue("resize_image", {}, queue="s2")
    _dead(client, queue="s")  # task "t", error code BOOM
    (lease,) = client.claim("s2", worker="w")
    client.fail(lease, "TIMEOUT_X", retryable=False, detail="slow")
    client.enqueue("send_mail", {}, queue="s")
    for path in ("/jobs", "/dead"):
        page = web.get(path).text
        assert 'list="task-names"' in page and 'list="error-codes"' in page
        assert _options(page, "task-names") == ["resize_image", "send_mail", "t"]
        assert _options(page, "error-codes") == ["BOOM", "TIMEOUT_X"]
        # A live refresh replaces only the counts and the table: no suggestions read.
        live = web.get(path, headers=LIVE).text
        assert _options(live, "task-names") == [] and _options(live, "error-codes") == []
    # The source is bounded: the newest `window` jobs only.
    assert client.web_suggestions(window=1) == (["send_mail"], [])
    tasks, codes = client.web_suggestions(window=2)
    assert codes == ["BOOM"] and tasks == ["send_mail", "t"]
    with pytest.raises(leaseq.LeaseqError):
        client.web_suggestions(window=0)
