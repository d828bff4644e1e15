"""The dashboard's routes on a real PostgreSQL (Starlette's TestClient): every page answers,
every action goes through the audited client API and ends in a redirect (POST-redirect-GET),
and every refusal (no auth, no CSRF token, read-only, not allowed, a live duplicate, hostile
filter input) is a message with a 4xx status that changes nothing. The security round of
issue 29 (a forged Host, a foreign Origin, purge-all, session-bound tokens, throttled
logins, 500s with headers, redacted filters, Secure cookies) is in test_web_security.py."""

from __future__ import annotations

import base64
import re
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.applications import Starlette
from starlette.routing import Mount

with warnings.catch_warnings():
    # Starlette asks for httpx2 in its test client; httpx works the same for these tests.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import leaseq
from leaseq.web import BasicAuth, create_app
from leaseq.web.security import SESSION_COOKIE
from tests.support.helpers import rows

AUTH = ("ops", "s3cret")


def _basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


HEADERS = _basic(*AUTH)


def _dead(client: leaseq.Client, queue: str = "default", **kw: Any) -> int:
    job = int(client.enqueue("t", {"user": 7}, queue=queue, **kw))
    (lease,) = client.claim(queue, worker="w")
    assert lease.job_id == job
    assert client.fail(lease, "BOOM", retryable=False, detail="password=hunter2 broke")
    return job


def _app(dsn: str, schema: str, **kw: Any) -> Starlette:
    kw.setdefault("auth", BasicAuth(*AUTH))
    return create_app(leaseq.AsyncClient(dsn, schema=schema), close_client=True, **kw)


@pytest.fixture()
def web(dsn: str, schema: str, client: leaseq.Client) -> Iterator[TestClient]:
    with TestClient(_app(dsn, schema), headers=HEADERS) as tc:
        yield tc


def _token(tc: TestClient, path: str = "/") -> str:
    page = tc.get(path)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None, "no CSRF field on " + path
    return found.group(1)


def _minted(tc: TestClient) -> str:
    """A valid token of this session (read-only pages have no form to take one from)."""
    session = tc.cookies.get(SESSION_COOKIE)
    assert session
    return str(tc.app.state.web.csrf.issue(session, AUTH[0]))  # type: ignore[attr-defined]


def _status(dsn: str, schema: str, job: int) -> str:
    return str(rows(dsn, "SELECT status FROM {s}.jobs WHERE id = %s", schema, job)[0][0])


def _events(dsn: str, schema: str, job: int) -> list[tuple[Any, ...]]:
    return rows(
        dsn,
        "SELECT event, actor FROM {s}.job_events WHERE job_id = %s ORDER BY id",
        schema,
        job,
    )


# -- pages --------------------------------------------------------------------------------


def test_every_page_answers_with_security_headers(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    dead = _dead(client, queue="mail", ordering_key="acct-1")
    client.enqueue("t", {"x": 1}, queue="mail")
    for path in [
        "/",
        "/partials/overview",
        "/queues/mail",
        "/jobs",
        "/jobs?state=dead&queue=mail",
        f"/jobs/{dead}",
        "/dead",
        "/keys",
        "/pauses",
        "/static/htmx.min.js",
        "/static/style.css",
    ]:
        page = web.get(path)
        assert page.status_code == 200, (path, page.text[:300])
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
    overview = web.get("/").text
    assert "mail" in overview and "<svg" in overview and 'hx-trigger="every 5s"' in overview
    # No inline script or style anywhere (the CSP would block it).
    assert "<script>" not in overview and "style=" not in overview
    assert "acct-1" in web.get("/keys").text


def test_job_detail_redacts_and_shows_the_trail(web: TestClient, client: leaseq.Client) -> None:
    job = int(client.enqueue("t", {"api_key": "abcd1234secret", "user": 7}, unique_key="u-7"))
    (lease,) = client.claim("default", worker="host-a")
    assert client.fail(lease, "BOOM", retryable=False)
    page = web.get(f"/jobs/{job}").text
    assert "abcd1234secret" not in page and "***" in page
    assert "host-a" in page and "BOOM" in page and "u-7" in page
    assert web.get("/jobs/999999").status_code == 404
    assert web.get("/jobs/abc").status_code == 400


def test_job_list_filters_and_keyset_pagination(web: TestClient, client: leaseq.Client) -> None:
    ids = [int(client.enqueue("t", {"user": i % 3}, queue="q")) for i in range(120)]
    first = web.get("/jobs?queue=q").text
    shown = [int(x) for x in re.findall(r'href="/jobs/(\d+)"', first)]
    assert shown == sorted(ids, reverse=True)[:50]
    nxt = re.search(r'rel="next" href="([^"]+)"', first)
    assert nxt is not None
    second = web.get(nxt.group(1).replace("&amp;", "&")).text
    assert [int(x) for x in re.findall(r'href="/jobs/(\d+)"', second)] == sorted(ids, reverse=True)[
        50:100
    ]
    contained = web.get('/jobs?payload={"user": 2}').text
    found = {int(x) for x in re.findall(r'href="/jobs/(\d+)"', contained)}
    assert found and all(ids.index(j) % 3 == 2 for j in found)


@pytest.mark.parametrize(
    "query",
    [
        "queue=%27%3B%20DROP%20TABLE%20jobs%3B--",
        "task=%25%25%25",
        "error_code=%E2%9C%93%F0%9F%92%A5",
        "ordering_key=" + "x" * 5000,
        "unique_key=%00nul",
        "payload=not%20json",
        "payload=" + "%7B%22a%22%3A%22" + "y" * 5000 + "%22%7D",
        "payload=%7B%22a%22%3A%22%5Cu0000%22%7D",
        "state=exploded",
        "before=-3",
        "before=" + "9" * 40,
    ],
)
def test_hostile_filter_input_is_a_message_and_changes_nothing(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str, query: str
) -> None:
    dead = _dead(client)
    before = rows(dsn, "SELECT count(*), max(id) FROM {s}.jobs", schema)
    for path in ("/jobs", "/dead"):
        page = web.get(f"{path}?{query}")
        assert page.status_code in (200, 400), (path, query, page.status_code)
        if page.status_code == 400:
            assert 'class="flash error"' in page.text
    assert rows(dsn, "SELECT count(*), max(id) FROM {s}.jobs", schema) == before
    assert _status(dsn, schema, dead) == "dead"


def test_overview_counts_equal_the_status_view_with_blocked_and_scheduled_jobs(
    client: leaseq.Client,
) -> None:
    """web_queue_stats reads pending jobs from two partial indexes instead of the view's
    scan: blocked keyed jobs (outside the claim index) must still be counted."""
    _dead(client, queue="k", ordering_key="acct")
    client.enqueue("t", {}, queue="k", ordering_key="acct")  # blocked behind the dead head
    client.enqueue("t", {}, queue="k", delay=600)  # scheduled
    client.enqueue("t", {}, queue="k", ordering_key="other")
    client.enqueue("t", {}, queue="r")
    client.claim("r", worker="w")
    stats, _ = client.web_overview()

    def counts(rows: list[leaseq.QueueStats]) -> list[tuple[Any, ...]]:
        return [(s.queue, s.ready, s.scheduled, s.running, s.dead, s.near_expiry) for s in rows]

    assert counts(stats) == counts(client.queue_stats())
    assert [(s.queue, s.ready, s.scheduled, s.running, s.dead) for s in stats] == [
        ("k", 2, 1, 0, 1),
        ("r", 0, 0, 1, 0),
    ]


def test_hostile_path_and_form_input_is_a_message_and_changes_nothing(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    dead = _dead(client)
    assert web.get("/queues/" + "q" * 5000).status_code == 400
    assert web.get("/queues/%E2%9C%93'%25").status_code == 200
    token = _token(web, "/pauses")
    for form in (
        {"scope": "queue", "value": "v" * 5000, "reason": "r"},
        {"scope": "queue", "value": "a\x00b", "reason": "r"},
        {"scope": "queue", "value": "q", "reason": "r" * 5000},
        {"scope": "queue", "value": "q", "reason": "   "},
        {"scope": "'; DROP TABLE pauses; --", "value": "q", "reason": "r"},
    ):
        page = web.post("/pauses/pause", data={"csrf_token": token, **form})
        assert page.status_code == 400 and 'class="flash error"' in page.text, form
    for path, extra in [
        (f"/jobs/{dead}/replay", {"reason": "x" * 5000}),
        (f"/jobs/{dead}/cancel", {"reason": "x" * 5000}),
        (f"/keys/{dead}/skip", {"reason": "x" * 5000}),
        ("/dead/replay", {"reason": "x" * 5000}),
        ("/dead/replay", {"reason": "ok", "queue": "q" * 5000}),
        ("/dead/purge", {"reason": "ok", "error_code": "\x00"}),
        ("/dead/purge", {"reason": "ok", "task": "t" * 201}),
    ]:
        page = web.post(path, data={"csrf_token": token, **extra})
        assert page.status_code == 400, (path, page.status_code)
    assert (
        web.post("/jobs/abc/replay", data={"csrf_token": token, "reason": "x"}).status_code == 400
    )
    assert client.pauses() == [] and _status(dsn, schema, dead) == "dead"
    assert [e for e, _ in _events(dsn, schema, dead)] == ["dead"]


# -- actions ------------------------------------------------------------------------------


def test_replay_from_job_page_is_audited_with_the_user(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    job = _dead(client)
    token = _token(web, f"/jobs/{job}")
    page = web.post(f"/jobs/{job}/replay", data={"csrf_token": token, "reason": "fixed SMTP"})
    assert page.status_code == 200 and "replayed" in page.text
    assert _status(dsn, schema, job) == "pending"
    assert ("replayed", "web:ops") in _events(dsn, schema, job)
    again = web.post(f"/jobs/{job}/replay", data={"csrf_token": token, "reason": "again"})
    assert again.status_code == 409 and "not dead" in again.text


def test_replay_meeting_a_live_duplicate_is_a_message_and_changes_nothing(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    dead = _dead(client, unique_key="invoice-9")
    live = int(client.enqueue("t", {}, unique_key="invoice-9"))
    token = _token(web, f"/jobs/{dead}")
    page = web.post(f"/jobs/{dead}/replay", data={"csrf_token": token, "reason": "retry"})
    assert page.status_code == 409
    assert "replay refused" in page.text and str(live) in page.text
    assert _status(dsn, schema, dead) == "dead" and _status(dsn, schema, live) == "pending"
    form = {"csrf_token": token, "reason": "retry all", "confirm_all": "all 1"}
    bulk = web.post("/dead/replay", data=form)
    assert bulk.status_code == 200 and "1 refused" in bulk.text
    assert _status(dsn, schema, dead) == "dead"


def test_bulk_dry_run_replay_and_purge_by_filter(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    a = [_dead(client, queue="a") for _ in range(3)]
    b = _dead(client, queue="b")
    token = _token(web, "/dead")
    dry = web.post("/dead/replay", data={"csrf_token": token, "queue": "a", "dry_run": "1"})
    assert dry.status_code == 200 and "would take 3 dead jobs" in dry.text
    assert all(_status(dsn, schema, j) == "dead" for j in a)
    no_reason = web.post("/dead/replay", data={"csrf_token": token, "queue": "a"})
    assert no_reason.status_code == 400 and "needs a reason" in no_reason.text
    assert all(_status(dsn, schema, j) == "dead" for j in a)
    done = web.post("/dead/replay", data={"csrf_token": token, "queue": "a", "reason": "fix"})
    assert "replayed 3 jobs" in done.text
    assert all(_status(dsn, schema, j) == "pending" for j in a)
    purged = web.post("/dead/purge", data={"csrf_token": token, "queue": "b", "reason": "junk"})
    assert "purged 1 jobs" in purged.text
    assert not rows(dsn, "SELECT 1 FROM {s}.jobs WHERE id = %s", schema, b)


def test_cancel_skip_pause_and_resume(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    pending = int(client.enqueue("t", {}, queue="other"))
    token = _token(web, "/pauses")
    cancel = web.post(f"/jobs/{pending}/cancel", data={"csrf_token": token, "reason": "dup"})
    assert cancel.status_code == 200 and _status(dsn, schema, pending) == "cancelled"
    head = _dead(client, ordering_key="acct")
    client.enqueue("t", {}, ordering_key="acct")
    skip = web.post(f"/keys/{head}/skip", data={"csrf_token": token, "reason": "obsolete"})
    assert skip.status_code == 200 and "skipped" in skip.text
    form = {"csrf_token": token, "scope": "queue", "value": "mail", "reason": "SMTP down"}
    assert "paused mail" in web.post("/pauses/pause", data=form).text
    assert [p.value for p in client.pauses()] == ["mail"]
    assert "resumed mail" in web.post("/pauses/resume", data=form).text
    assert client.pauses() == []
    again = web.post("/pauses/resume", data=form)
    assert again.status_code == 409 and "was not paused" in again.text
    bad = web.post("/pauses/pause", data={**form, "scope": "planet"})
    assert bad.status_code == 400 and client.pauses() == []


# -- refusals -----------------------------------------------------------------------------


def test_auth_denied_without_or_with_wrong_credentials(dsn: str, schema: str) -> None:
    with TestClient(_app(dsn, schema)) as tc:
        for headers in (
            {},
            _basic("ops", "wrong"),
            _basic("x", "s3cret"),
            {"authorization": "Basic %%%"},
        ):
            page = tc.get("/", headers=headers)
            assert page.status_code == 401
            assert page.headers["www-authenticate"].startswith("Basic")
            assert page.headers["x-frame-options"] == "DENY"
        assert tc.post("/dead/purge", data={"reason": "x"}).status_code == 401


def test_post_without_or_with_a_forged_csrf_token_changes_nothing(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    job = _dead(client)
    _token(web, f"/jobs/{job}")  # the cookie is set
    for data in ({"reason": "x"}, {"reason": "x", "csrf_token": "forged.deadbeef"}):
        page = web.post(f"/jobs/{job}/replay", data=data)
        assert page.status_code == 403 and "CSRF" in page.text
    # A token copied from the page but sent without its cookie (another site's form).
    token = _token(web, f"/jobs/{job}")
    web.cookies.delete(SESSION_COOKIE)
    page = web.post(f"/jobs/{job}/replay", data={"reason": "x", "csrf_token": token})
    assert page.status_code == 403
    assert _status(dsn, schema, job) == "dead"


def test_read_only_hides_and_refuses_every_action(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    job = _dead(client)
    with TestClient(_app(dsn, schema, read_only=True), headers=HEADERS) as tc:
        page = tc.get(f"/jobs/{job}").text
        assert "Replay</button>" not in page
        assert "Purge all" not in tc.get("/dead").text
        # No form on any page; a valid token (the cookie's own) still gets no action done.
        token = _minted(tc)
        for path in (f"/jobs/{job}/replay", "/dead/replay", "/dead/purge", "/pauses/pause"):
            data = {"csrf_token": token, "reason": "x", "scope": "queue", "value": "q"}
            refused = tc.post(path, data=data)
            assert refused.status_code == 403 and "read-only" in refused.text
    assert _status(dsn, schema, job) == "dead" and client.pauses() == []


def test_authorize_hook_decides_each_action(dsn: str, schema: str, client: leaseq.Client) -> None:
    job = _dead(client)
    app = _app(dsn, schema, authorize=lambda user, action: action != "purge")
    with TestClient(app, headers=HEADERS) as tc:
        token = _token(tc, "/dead")
        refused = tc.post("/dead/purge", data={"csrf_token": token, "reason": "x"})
        assert refused.status_code == 403 and "not allowed" in refused.text
        assert _status(dsn, schema, job) == "dead"
        ok = tc.post(f"/jobs/{job}/replay", data={"csrf_token": token, "reason": "x"})
        assert ok.status_code == 200 and _status(dsn, schema, job) == "pending"


def test_mounted_under_a_prefix_links_and_actions_keep_it(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    job = _dead(client)
    outer = Starlette(routes=[Mount("/ops/queue", app=_app(dsn, schema))])
    with TestClient(outer, headers=HEADERS) as tc:
        page = tc.get(f"/ops/queue/jobs/{job}")
        assert page.status_code == 200
        assert 'href="/ops/queue/static/style.css"' in page.text
        assert f'action="/ops/queue/jobs/{job}/replay"' in page.text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token is not None
        done = tc.post(
            f"/ops/queue/jobs/{job}/replay", data={"csrf_token": token.group(1), "reason": "x"}
        )
        assert done.status_code == 200 and _status(dsn, schema, job) == "pending"


def test_statement_timeout_is_a_503_message_not_a_500(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.enqueue("t", {})
    aclient = leaseq.AsyncClient(dsn, schema=schema)
    aclient.web_timeout_ms = 300
    app = create_app(aclient, auth=BasicAuth(*AUTH), close_client=True)
    with TestClient(app, headers=HEADERS) as tc, psycopg.connect(dsn) as blocker:
        assert tc.get("/jobs").status_code == 200
        # A lock held elsewhere stands in for a slow plan: the read waits past the timeout.
        blocker.execute(
            sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema))
        )
        for path in ("/", "/jobs", "/dead"):
            page = tc.get(path)
            assert page.status_code == 503, (path, page.text[:200])
            assert "statement timeout" in page.text
            assert page.headers["x-frame-options"] == "DENY"
        blocker.rollback()
        assert tc.get("/jobs").status_code == 200


def test_schedules_page_runs_enables_and_disables_through_the_audited_api(
    web: TestClient, dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.schedule_add("nightly", task="t", cron="0 3 * * *", tz="Europe/Berlin", reason="new")
    page = web.get("/schedules")
    assert page.status_code == 200
    assert "nightly" in page.text and "Europe/Berlin" in page.text
    token = _token(web, "/schedules")
    ran = web.post("/schedules/nightly/run", data={"csrf_token": token, "reason": "catch up"})
    assert ran.status_code == 200 and "enqueued" in ran.text
    job_id = int(re.search(r"job (\d+) enqueued", ran.text).group(1))  # type: ignore[union-attr]
    assert _status(dsn, schema, job_id) == "pending"
    off = web.post("/schedules/nightly/disable", data={"csrf_token": token, "reason": "maint"})
    assert off.status_code == 200 and "disabled" in off.text
    (schedule,) = client.schedules()
    assert not schedule.enabled
    again = web.post("/schedules/nightly/disable", data={"csrf_token": token, "reason": "maint"})
    assert again.status_code == 409 and "already disabled" in again.text
    # Refusals change nothing: no reason, an unknown schedule, no CSRF token.
    assert web.post("/schedules/nightly/enable", data={"csrf_token": token}).status_code == 400
    unknown = web.post("/schedules/nope/enable", data={"csrf_token": token, "reason": "x"})
    assert unknown.status_code == 409
    assert web.post("/schedules/nightly/enable", data={"reason": "x"}).status_code == 403
    assert not client.schedules()[0].enabled
    actions = [(e.action, e.actor) for e in client.admin_events(scope="schedule", value="nightly")]
    assert ("schedule.run", "web:ops") in actions and ("schedule.disable", "web:ops") in actions


def test_schedule_actions_are_refused_in_read_only_mode(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.schedule_add("hourly", task="t", every=3600, reason="new")
    with TestClient(_app(dsn, schema, read_only=True), headers=HEADERS) as tc:
        page = tc.get("/schedules")
        assert "hourly" in page.text and "Run now" not in page.text
        token = _minted(tc)  # no form on the page: a valid token minted for the session
        refused = tc.post("/schedules/hourly/disable", data={"csrf_token": token, "reason": "x"})
        assert refused.status_code == 403 and "read-only" in refused.text
    assert client.schedules()[0].enabled


def test_job_page_shows_the_durable_timeline(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    job = client.enqueue("t")
    (lease,) = client.claim(worker="w")
    assert client.step_record(lease, "fetch-rows", 0, {"rows": 3})
    assert client.wait_point(lease, record="sleep-2", until=None, signal="approval")[0] == "suspend"
    assert client.signal(job, "note", {"from": "ops"}, actor="ada")
    page = web.get(f"/jobs/{job}").text
    assert "Suspended (signal)" in page and "waits without a timeout" in page
    assert "<h2>Steps</h2>" in page and "fetch-rows" in page and "&#34;rows&#34;: 3" in page
    assert "<h2>Signals</h2>" in page and "note" in page and "ada" in page
    overview = web.get("/").text
    assert ">Suspended</th>" in overview and '<td class="n">1</td>' in overview
