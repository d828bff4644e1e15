"""The dashboard in a real browser: `leaseq web` (uvicorn, basic auth) on a free loopback
port, Debian's headless chromium driven by Playwright. Load the overview (its live refresh
polls under the strict CSP), filter the job list (its live refresh held while a row is
selected; its filters' suggestions), open a dead job, replay it with a reason,
see it pending. No page may log a console error (a CSP violation is one).

Screenshots go to the test's temporary directory; with LEASEQ_WEB_SCREENSHOTS=DIR set they
go to DIR (how docs/screenshots/ is refreshed).
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("playwright")

from playwright.sync_api import Page, expect, sync_playwright

import leaseq
from tests.support.ports import free_port
from tests.support.requires import tool_path

USER, PASSWORD = "ops", "browser-pw"
pytestmark = [pytest.mark.slow, pytest.mark.requires("chromium")]


def _seed(client: leaseq.Client) -> int:
    """A few queues with work, history, one blocked key, and a dead job to replay."""
    for i in range(12):
        client.enqueue("send_email", {"to": f"user{i}@example.org"}, queue="mail")
    for i in range(5):
        client.enqueue("resize", {"image": i}, queue="media", delay=600)
    for lease in client.claim("mail", worker="host-a:4242", limit=4):
        client.complete(lease)
    client.claim("mail", worker="host-a:4242", limit=2)
    client.enqueue(
        "charge",
        {"order": 1, "api_key": "sk_live_abcdef123456"},
        queue="billing",
        ordering_key="acct-42",
    )
    (lease,) = client.claim("billing", worker="host-b:77")
    client.fail(lease, "CARD_DECLINED", retryable=False, detail="gateway said no")
    client.enqueue("charge", {"order": 2}, queue="billing", ordering_key="acct-42")
    dead = int(client.enqueue("send_email", {"to": "broken@example.org"}, queue="mail"))
    for lease in client.claim("mail", worker="host-a:4242", limit=20):
        if lease.job_id == dead:
            client.fail(lease, "SMTP_REFUSED", retryable=False, detail="550 mailbox unavailable")
    client.pause("media", reason="image service upgrade", actor="alice")
    return dead


def _long_error(client: leaseq.Client) -> int:
    """A dead job whose error is a traceback ending in one 3,000-character line."""
    job = int(client.enqueue("parse", {"file": "huge.csv"}, queue="etl"))
    (lease,) = client.claim("etl", worker="host-c:9")
    detail = (
        'Traceback (most recent call last):\n  File "etl.py", line 9\nValueError: ' + "z" * 3000
    )
    client.fail(lease, "PARSE_FAILED", retryable=False, detail=detail)
    return job


def _fits(page: Page) -> bool:
    """The page does not scroll sideways (a table may scroll inside itself)."""
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))


@pytest.fixture()
def server(dsn: str, schema: str, client: leaseq.Client) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "LEASEQ_DSN": dsn,
        "LEASEQ_SCHEMA": schema,
        "LEASEQ_WEB_USER": USER,
        "LEASEQ_WEB_PASSWORD": PASSWORD,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "leaseq", "web", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    pytest.fail(f"leaseq web did not start: {out}")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _shots(tmp_path: pathlib.Path) -> pathlib.Path:
    target = pathlib.Path(os.environ.get("LEASEQ_WEB_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


def test_overview_filter_open_dead_job_replay_it(
    server: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    dead = _seed(client)
    long_error = _long_error(client)
    shots = _shots(tmp_path)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=tool_path("chromium"), headless=True, args=["--no-sandbox"]
        )
        context = browser.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 1100, "height": 640},
        )
        # Page timers run on Playwright's clock (real time, flowing), so the test can move
        # it on to htmx's next poll instead of waiting five seconds for it.
        context.clock.install()
        page: Page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        # Overview: every queue, and htmx's poll replaces the table (htmx ran under the CSP).
        page.goto(server + "/")
        expect(page.locator("#overview")).to_contain_text("billing")
        expect(page.locator("#overview")).to_contain_text("paused")
        assert page.evaluate("typeof htmx") == "object"
        with page.expect_response(lambda r: "/partials/overview" in r.url, timeout=15_000):
            page.clock.fast_forward(5_000)
        page.screenshot(path=str(shots / "overview.png"))

        # Job list: filter dead jobs of the mail queue.
        page.click("text=Jobs")
        page.select_option("select[name=state]", "dead")
        page.fill("input[name=queue]", "mail")
        page.click("form.filters button")
        expect(page).to_have_url(
            f"{server}/jobs?state=dead&queue=mail" + "&task=&error_code="
            "&ordering_key=&unique_key=&payload=&created_after=&created_before="
        )
        rows = page.locator("tbody tr")
        expect(rows).to_have_count(1)
        page.screenshot(path=str(shots / "jobs.png"))

        # Open the dead job, replay it with a reason, see it pending.
        page.click(f"a[href='/jobs/{dead}']")
        expect(page.locator("h1")).to_contain_text("dead")
        expect(page.locator("body")).to_contain_text("SMTP_REFUSED")
        page.screenshot(path=str(shots / "job.png"), full_page=True)
        page.fill("form.action input[name=reason]", "mail relay fixed")
        page.click("text=Replay")
        expect(page.locator(".flash.ok")).to_contain_text(f"job {dead} replayed: pending")
        expect(page.locator("h1 .state")).to_have_text("pending")
        expect(page.locator("body")).to_contain_text("web:ops")

        # The other main pages render under the CSP too.
        page.goto(server + "/dead")
        expect(page.locator("body")).to_contain_text("CARD_DECLINED")
        page.screenshot(path=str(shots / "dead.png"))
        page.goto(server + "/keys")
        expect(page.locator("body")).to_contain_text("acct-42")
        page.goto(server + "/pauses")
        expect(page.locator("body")).to_contain_text("image service upgrade")
        page.screenshot(path=str(shots / "pauses.png"))

        # A 3,000-character error line wraps: the job page stays as wide as the window,
        # and the traceback keeps its line breaks.
        page.goto(f"{server}/jobs/{long_error}")
        expect(page.locator("pre.detail")).to_contain_text("Traceback")
        assert _fits(page)
        lines = page.evaluate("document.querySelector('pre.detail').innerText.split('\\n').length")
        assert lines >= 3

        # Every page renders under the CSP with no console error; each is screenshotted.
        client.set_limit("queue:mail", concurrency=4, reason="smtp pool")
        client.schedule_add("nightly", task="t", cron="0 3 * * *", tz="Europe/Berlin", reason="x")
        for name, path, text in (
            ("queue", "/queues/mail", "mail"),
            ("dead-groups", "/dead/groups", "CARD_DECLINED"),
            ("workers", "/workers", "host-a:4242"),
            ("tasks", "/tasks", "send_email"),
            ("keys", "/keys", "acct-42"),
            ("schedules", "/schedules", "Europe/Berlin"),
            ("limits", "/limits", "queue:mail"),
        ):
            page.goto(server + path)
            expect(page.locator("main")).to_contain_text(text)
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

        # Find by id from the header.
        page.fill("header form.find input[name=id]", str(dead))
        page.press("header form.find input[name=id]", "Enter")
        expect(page).to_have_url(f"{server}/jobs/{dead}")

        # Bulk selection: cancel two pending jobs of the job list.
        page.goto(server + "/jobs?state=pending&queue=media")
        boxes = page.locator("input[name=ids]")
        boxes.nth(0).check()
        boxes.nth(1).check()
        page.select_option("form#bulk select[name=action]", "cancel")
        page.fill("form#bulk input[name=reason]", "duplicates")
        page.click("form#bulk button")
        expect(page.locator(".flash.ok")).to_contain_text("cancelled 2 of 2 selected jobs")

        # The job list: its task and error code filters suggest values, and it refreshes
        # live from its own URL (filters kept), held while a row is selected (it says so).
        page.goto(server + "/jobs?state=pending&queue=media")
        expect(page.locator("#task-names option[value=resize]")).to_have_count(1)
        expect(page.locator("#error-codes option[value=CARD_DECLINED]")).to_have_count(1)
        refreshes: list[str] = []
        page.on(
            "request", lambda r: refreshes.append(r.url) if "x-leaseq-live" in r.headers else None
        )
        boxes = page.locator("#live input[name=ids]")
        expect(boxes).to_have_count(3)
        boxes.nth(0).check()
        expect(page.locator(".live-held")).to_have_text("Live updates held: 1 selected")
        fresh = int(client.enqueue("resize", {"image": 99}, queue="media", delay=600))
        page.clock.fast_forward(11_000)
        page.wait_for_timeout(300)
        assert refreshes == []
        expect(boxes.nth(0)).to_be_checked()
        boxes.nth(0).uncheck()
        expect(page.locator(".live-held")).to_be_hidden()
        with page.expect_request(lambda r: "x-leaseq-live" in r.headers, timeout=15_000) as seen:
            page.clock.fast_forward(5_000)
        assert "state=pending&queue=media" in seen.value.url
        expect(page.locator(f"#live a[href='/jobs/{fresh}']")).to_have_count(1)
        expect(page.locator("#live input[name=ids]")).to_have_count(4)

        # Live updates: the overview polls; paused (the header's button) or with the tab
        # hidden it does not.
        page.goto(server + "/")
        toggle = page.locator("button.live-toggle")
        expect(toggle).to_be_visible()
        polls: list[str] = []
        page.on("request", lambda r: polls.append(r.url) if "/partials/overview" in r.url else None)
        toggle.click()
        expect(toggle).to_have_text("Resume live updates")
        page.clock.fast_forward(11_000)
        page.wait_for_timeout(300)
        assert polls == []
        toggle.click()
        expect(toggle).to_have_text("Pause live updates")
        with page.expect_request(lambda r: "/partials/overview" in r.url, timeout=15_000):
            page.clock.fast_forward(5_000)
        page.evaluate(
            "Object.defineProperty(document, 'hidden', {value: true, configurable: true})"
        )
        polls.clear()
        page.clock.fast_forward(11_000)
        page.wait_for_timeout(300)
        assert polls == []

        # A phone: no page scrolls sideways.
        phone = browser.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 390, "height": 844},
            is_mobile=True,
        )
        small = phone.new_page()
        small.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        for path in (
            "/",
            "/jobs",
            f"/jobs/{long_error}",
            "/dead",
            "/dead/groups",
            "/workers",
            "/tasks",
            "/pauses",
            "/limits",
        ):
            small.goto(server + path)
            assert _fits(small), path
        small.goto(server + "/")
        small.screenshot(path=str(shots / "phone.png"))
        phone.close()
        browser.close()
    job = client.get_job(dead)
    assert job is not None and job.status == "pending"
    assert errors == []


def test_a_fair_queues_keys_and_a_weight_edit(
    server: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    # A fair queue: its page lists its keys by backlog (weight, running, share, parked) and
    # links to the full list, where a key's weight is set with a reason (audited, the
    # user as the actor) and the shares follow.
    client.enqueue_many([{"task": "report", "fairness_key": "acme"} for _ in range(30)])
    client.enqueue_many([{"task": "report", "fairness_key": "globex"} for _ in range(10)])
    client.enqueue("report", fairness_key="initech")
    assert len(client.claim("default", worker="host-a:1", limit=3)) == 3  # one of each key
    client.enqueue("report", fairness_key="initech")  # a backlog of 29, 9 and 1
    shots = _shots(tmp_path)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=tool_path("chromium"), headless=True, args=["--no-sandbox"]
        )
        context = browser.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 1100, "height": 640},
        )
        page: Page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server + "/queues/default")
        table = page.locator("#fair-keys")
        expect(table.locator("tbody tr").first).to_contain_text("acme")
        page.click("text=All keys of default")
        expect(page).to_have_url(server + "/queues/default/keys")
        first = page.locator("#fair-keys tbody tr").first
        expect(first).to_contain_text("acme")
        expect(first).to_contain_text("33.3 %")  # 1 of the 3 keys with a backlog, weight 1
        page.screenshot(path=str(shots / "fair-keys.png"), full_page=True)
        page.fill("#fair-keys tbody tr:first-child input[name=weight]", "2")
        page.fill("#fair-keys tbody tr:first-child input[name=reason]", "enterprise plan")
        page.click("#fair-keys tbody tr:first-child button")
        expect(page.locator(".flash.ok")).to_contain_text("key 'acme': weight 2")
        expect(page.locator("#fair-keys tbody tr").first).to_contain_text("50.0 %")
        browser.close()
    assert errors == []
    weights = {k.key: k.weight for k in client.fair_keys("default")}
    assert weights["acme"] == 2.0
    event = next(e for e in client.admin_events() if e.action == "fair_weight")
    assert event.actor == "web:ops" and event.reason == "enterprise plan"
