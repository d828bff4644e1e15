"""The dashboard's newer pages and actions (issue 29) on a real PostgreSQL: /workers (who
holds leases, stale ones), /tasks (run time p50/p95/p99 and failure rate from SQL, checked
against the same figures computed here), dead jobs by error code, find by id, per-state
counts and time ranges on the job list, the bulk selection (cancel, retry, delete), deleting
one job, and editing limits; every change audited with the dashboard user."""

from __future__ import annotations

import re
import statistics
import warnings
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import leaseq
from tests.integration.test_web_routes import HEADERS, _app, _dead, _events, _status, _token
from tests.support.helpers import rows, run_sql


@pytest.fixture()
def web(dsn: str, schema: str, client: leaseq.Client) -> Iterator[TestClient]:
    with TestClient(_app(dsn, schema), headers=HEADERS) as tc:
        yield tc


def test_workers_page_shows_each_lease_owner_and_stale_leases(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    for _ in range(5):
        client.enqueue("t", {}, queue="w")
    held_a = client.claim("w", worker="host-a:1", limit=3)
    held_b = client.claim("w", worker="host-b:2", limit=2)
    # host-b stopped heartbeating: its leases ran out and await the sweep.
    run_sql(
        dsn,
        "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1 minute' "
        "WHERE lease_owner LIKE 'host-b:2%%'",
        schema,
    )
    page = web.get("/workers")
    assert page.status_code == 200
    a = re.search(r"<td>host-a:1[^<]*</td>.*?</tr>", page.text, re.S)
    b = re.search(r'<tr class="stale">\s*<td>host-b:2[^<]*</td>.*?</tr>', page.text, re.S)
    assert a is not None and b is not None
    assert re.findall(r'<td class="n">(\d+)</td>', a.group(0)) == ["3", "0"]
    assert re.findall(r'<td class="n">(\d+)</td>', b.group(0)) == ["2", "2"]
    assert {int(x) for x in re.findall(r'href="/jobs/(\d+)"', a.group(0))} == {
        lease.job_id for lease in held_a
    }
    assert len(held_b) == 2 and "<b>5</b> running jobs" in page.text


def test_tasks_page_percentiles_and_failure_rate_come_from_sql(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    durations = [0.010 * (i + 1) for i in range(40)]  # 10 ms .. 400 ms
    for seconds in durations:
        client.enqueue("resize", {}, queue="img")
        (lease,) = client.claim("img", worker="w")
        client.complete(lease)
        run_sql(
            dsn,
            "UPDATE {s}.jobs SET started_at = finished_at - make_interval(secs => %s) "
            "WHERE id = %s",
            schema,
            seconds,
            lease.job_id,
        )
    for _ in range(10):
        _dead(client, queue="img")  # task "t"
    _dead(client, queue="img")
    page = web.get("/tasks?window=1h")
    assert page.status_code == 200
    row = re.search(r">resize</a></td>.*?</tr>", page.text, re.S)
    assert row is not None
    cells = re.findall(r'<td class="n">(.*?)</td>', row.group(0))
    assert cells[0] == "40" and cells[1] == "0" and cells[2] == "0.0%"
    # PostgreSQL's percentile_cont is the linear interpolation statistics calls "inclusive".
    expected = statistics.quantiles(durations, n=100, method="inclusive")
    for shown, wanted in zip(cells[3:], (expected[49], expected[94], expected[98]), strict=True):
        assert shown == f"{wanted * 1000:.1f} ms", (shown, wanted)
    dead_row = re.search(r">t</a></td>.*?</tr>", page.text, re.S)
    assert dead_row is not None
    dead_cells = re.findall(r'<td class="n">(.*?)</td>', dead_row.group(0))
    assert dead_cells[0] == "0" and ">11</a>" in dead_cells[1] and dead_cells[2] == "100.0%"
    assert web.get("/tasks?window=forever").status_code == 400


def test_dead_jobs_grouped_by_error_code(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    for _ in range(3):
        _dead(client, queue="g")
    job = int(client.enqueue("t", {}, queue="g"))
    (lease,) = client.claim("g", worker="w")
    client.fail(lease, "TIMEOUT", retryable=False)
    page = web.get("/dead/groups?queue=g").text
    boom = re.search(r">BOOM</a></td>\s*<td class=\"n\">(\d+)</td>", page)
    timeout = re.search(r">TIMEOUT</a></td>\s*<td class=\"n\">(\d+)</td>.*?/jobs/(\d+)", page, re.S)
    assert boom is not None and boom.group(1) == "3"
    assert timeout is not None and timeout.group(1) == "1" and int(timeout.group(2)) == job
    assert page.index(">BOOM<") < page.index(">TIMEOUT<")  # the biggest group first


def test_find_by_id_state_counts_and_time_range(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    old = int(client.enqueue("t", {}, queue="r"))
    new = int(client.enqueue("t", {}, queue="r"))
    client.enqueue("t", {}, queue="r", delay=600)
    _dead(client, queue="r-dead")
    run_sql(dsn, "UPDATE {s}.jobs SET created_at = '2020-01-01T00:00Z' WHERE id = %s", schema, old)
    found = web.get(f"/find?id={new}", follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"] == f"/jobs/{new}"
    assert web.get("/find?id=nope").status_code == 400
    page = web.get("/jobs").text
    # The queue filter suggests the known queues.
    assert 'list="queue-names"' in page and '<option value="r-dead">' in page
    counts = dict(
        re.findall(r'<span class="state (\w+)">\w+</span> (?:<span[^>]*>≈</span>)?(\d+)', page)
    )
    assert counts["pending"] == "3" and counts["dead"] == "1" and counts["running"] == "0"
    ranged = web.get("/jobs", params={"created_before": "2021-01-01T00:00"}).text
    ids = {int(x) for x in re.findall(r'href="/jobs/(\d+)"', ranged)}
    assert ids == {old}
    recent = web.get("/jobs", params={"created_after": "2021-01-01T00:00", "queue": "r"}).text
    assert old not in {int(x) for x in re.findall(r'href="/jobs/(\d+)"', recent)}
    assert web.get("/jobs", params={"created_after": "yesterday"}).status_code == 400


def test_bulk_selection_cancels_retries_and_deletes_audited(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    pending = [int(client.enqueue("t", {}, queue="b")) for _ in range(3)]
    dead = [_dead(client, queue="b-dead") for _ in range(2)]
    token = _token(web, "/jobs")
    cancel = web.post(
        "/jobs/bulk",
        data={"csrf_token": token, "action": "cancel", "reason": "dup", "ids": pending[:2]},
    )
    assert cancel.status_code == 200 and "cancelled 2 of 2 selected jobs" in cancel.text
    assert [_status(dsn, schema, j) for j in pending] == ["cancelled", "cancelled", "pending"]
    assert ("cancelled", "web:ops") in [(e, a) for e, a in _events(dsn, schema, pending[0])]
    retry = web.post(
        "/jobs/bulk",
        data={
            "csrf_token": token,
            "action": "replay",
            "reason": "fixed",
            "ids": [dead[0], pending[2]],
        },
    )
    assert "replayed 1 of 2 selected jobs" in retry.text and str(pending[2]) in retry.text
    assert _status(dsn, schema, dead[0]) == "pending"
    delete = web.post(
        "/jobs/bulk",
        data={"csrf_token": token, "action": "delete", "reason": "junk", "ids": [dead[1]]},
    )
    assert "deleted 1 of 1" in delete.text
    assert not rows(dsn, "SELECT 1 FROM {s}.jobs WHERE id = %s", schema, dead[1])
    for bad in (
        {"action": "cancel", "reason": "x"},  # nothing selected
        {"action": "explode", "reason": "x", "ids": [pending[2]]},
        {"action": "cancel", "ids": [pending[2]]},  # no reason
        {"action": "cancel", "reason": "x", "ids": ["abc"]},
        {"action": "cancel", "reason": "x", "ids": list(range(1, 102))},
    ):
        refused = web.post("/jobs/bulk", data={"csrf_token": token, **bad})
        assert refused.status_code == 400, bad
    assert (
        web.post(
            "/jobs/bulk", data={"action": "cancel", "reason": "x", "ids": [pending[2]]}
        ).status_code
        == 403
    )
    assert _status(dsn, schema, pending[2]) == "pending"


def test_delete_one_dead_job_from_its_page(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    job = _dead(client)
    live = int(client.enqueue("t", {}))
    page = web.get(f"/jobs/{job}").text
    assert f'action="/jobs/{job}/delete"' in page
    token = _token(web, f"/jobs/{job}")
    assert web.post(f"/jobs/{job}/delete", data={"csrf_token": token}).status_code == 400
    refused = web.post(f"/jobs/{live}/delete", data={"csrf_token": token, "reason": "x"})
    assert (
        "is not dead: nothing deleted" in refused.text and _status(dsn, schema, live) == "pending"
    )
    done = web.post(f"/jobs/{job}/delete", data={"csrf_token": token, "reason": "obsolete"})
    assert done.status_code == 200 and f"job {job} deleted" in done.text
    assert not rows(dsn, "SELECT 1 FROM {s}.jobs WHERE id = %s", schema, job)
    assert ("purged", "web:ops") in _events(dsn, schema, job)


def test_limits_are_edited_from_the_page_and_audited(
    web: TestClient, client: leaseq.Client
) -> None:
    token = _token(web, "/limits")
    form = {"csrf_token": token, "name": "queue:mail", "concurrency": "3", "reason": "smtp"}
    done = web.post("/limits/set", data=form)
    assert done.status_code == 200 and "limit queue:mail set" in done.text
    (limit,) = client.limits()
    assert limit.name == "queue:mail" and limit.concurrency == 3 and limit.updated_by == "web:ops"
    rated = web.post(
        "/limits/set",
        data={**form, "name": "task:resize", "concurrency": "", "rate": "10", "per": "60"},
    )
    assert "limit task:resize set" in rated.text
    assert {(x.name, x.rate) for x in client.limits()} == {
        ("queue:mail", None),
        ("task:resize", 10.0),
    }
    for bad in (
        {"name": "", "concurrency": "3"},
        {"name": "queue:x", "concurrency": ""},  # neither concurrency nor rate
        {"name": "queue:x", "concurrency": "-1"},
        {"name": "nonsense", "concurrency": "2"},
        {"name": "queue:x", "concurrency": "2", "reason": ""},
    ):
        refused = web.post("/limits/set", data={**form, **bad})
        assert refused.status_code == 400, bad
    removed = web.post("/limits/set", data={**form, "remove": "1"})
    assert "limit queue:mail removed" in removed.text
    assert [x.name for x in client.limits()] == ["task:resize"]


def test_live_updates_are_a_static_script_with_a_pause(web: TestClient) -> None:
    page = web.get("/workers").text
    assert 'src="/static/live.js"' in page and "data-live" in page and "live-toggle" in page
    script = web.get("/static/live.js").text
    assert "document.hidden" in script and "localStorage" in script


def test_job_page_shows_its_workflow_batch_and_stored_result(
    web: TestClient, client: leaseq.Client
) -> None:
    parent = int(client.enqueue("extract", {}, queue="wf"))
    child = int(client.enqueue("load", {}, queue="wf", depends_on=[parent]))
    (lease,) = client.claim("wf", worker="w")
    assert lease.job_id == parent
    value = '{"rows": 3, "token": "abc123secret"}'
    assert client.complete_many([lease], results={parent: (value, 3600.0)}) == {parent}
    page = web.get(f"/jobs/{parent}").text
    assert "<h2>Workflow</h2>" in page and f'href="/jobs/{child}"' in page
    assert "<h2>Stored result</h2>" in page and "&#34;rows&#34;: 3" in page
    assert "abc123secret" not in page  # the result passes the redaction hook too
    assert f'href="/jobs/{parent}"' in web.get(f"/jobs/{child}").text
    with client.batch(on_finish=leaseq.Sig("report")) as batch:
        member = int(batch.enqueue("part", {}, queue="bt"))
        batch.enqueue("part", {}, queue="bt")
    shown = web.get(f"/jobs/{member}").text
    assert f"<h2>Batch {batch.id}</h2>" in shown and "on_finish: report" in shown
    assert '<span class="state pending">pending</span> 2' in shown


def test_run_now_makes_a_delayed_job_available_audited(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    later = int(client.enqueue("t", {}, queue="rn", delay=3600))
    now = int(client.enqueue("t", {}, queue="rn"))
    page = web.get(f"/jobs/{later}").text
    assert f'action="/jobs/{later}/run"' in page
    assert f'action="/jobs/{now}/run"' not in web.get(f"/jobs/{now}").text
    assert client.claim("rn", worker="w", limit=5)[0].job_id == now
    token = _token(web, f"/jobs/{later}")
    assert web.post(f"/jobs/{later}/run", data={"csrf_token": token}).status_code == 400
    done = web.post(f"/jobs/{later}/run", data={"csrf_token": token, "reason": "urgent"})
    assert done.status_code == 200 and f"job {later} is available now" in done.text
    assert ("run_now", "web:ops") in _events(dsn, schema, later)
    (lease,) = client.claim("rn", worker="w")
    assert lease.job_id == later
    again = web.post(f"/jobs/{later}/run", data={"csrf_token": token, "reason": "again"})
    assert "not scheduled for later" in again.text
    assert [e for e, _ in _events(dsn, schema, later)].count("run_now") == 1


def test_a_jobs_page_shows_its_cost_when_it_is_not_one(
    web: TestClient, client: leaseq.Client
) -> None:
    heavy = int(client.enqueue("t", {}, cost=3))
    plain = int(client.enqueue("t", {}))
    assert (
        "<dt>Cost</dt><dd>3 units of each concurrency limit</dd>" in web.get(f"/jobs/{heavy}").text
    )
    assert "<dt>Cost</dt>" not in web.get(f"/jobs/{plain}").text
