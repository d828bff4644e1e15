"""The dashboard's security round (issue 29), on a real PostgreSQL through Starlette's
TestClient: the DNS-rebinding scenario (a forged Host, a POST with a foreign Origin) is
refused and changes nothing; purge or replay of every dead job needs the "all N"
confirmation; every action ends in a 303 (a reload repeats nothing); bad filters are 400s
without PostgreSQL's text; an unexpected error is a 500 with the security headers; tokens
are bound to their session and work across replicas sharing the secret; filters never
match redacted fields; failed logins are throttled; /limits runs under the statement
timeout; cookies are Secure behind a trusted TLS proxy only."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

pytest.importorskip("starlette")
pytest.importorskip("httpx")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import leaseq
from leaseq.web import BasicAuth, create_app
from leaseq.web.security import SESSION_COOKIE, Throttle
from tests.integration.test_web_routes import AUTH, HEADERS, _app, _basic, _dead, _status, _token
from tests.support.helpers import rows


@pytest.fixture()
def web(dsn: str, schema: str, client: leaseq.Client) -> Iterator[TestClient]:
    with TestClient(_app(dsn, schema), headers=HEADERS) as tc:
        yield tc


def _no_auth(dsn: str, schema: str, **kw: Any) -> Any:
    return create_app(leaseq.AsyncClient(dsn, schema=schema), close_client=True, **kw)


def test_dns_rebinding_a_forged_host_and_a_foreign_origin_are_refused(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The no-login mode, as `leaseq web` serves it on loopback: only loopback names."""
    _dead(client)
    app = _no_auth(dsn, schema, allowed_hosts=["127.0.0.1", "localhost", "::1"])
    with TestClient(app, base_url="http://127.0.0.1:8080") as tc:
        page = tc.get("/pauses")
        assert page.status_code == 200
        token = _token(tc, "/pauses")
        forged = {"host": "rebind.attacker.example:8080"}
        for path in ("/", "/dead", "/pauses"):
            refused = tc.get(path, headers=forged)
            assert refused.status_code == 421, path
            assert "csrf_token" not in refused.text
            assert refused.headers["x-frame-options"] == "DENY"
        assert tc.get("/", headers={"host": "bad host"}).status_code == 400
        form = {"csrf_token": token, "scope": "queue", "value": "mail", "reason": "x"}
        assert tc.post("/pauses/pause", data=form, headers=forged).status_code == 421
        # A page on another origin posting with the victim's cookie and a stolen token.
        for headers in (
            {"origin": "https://evil.example"},
            {"origin": "null"},
            {"sec-fetch-site": "cross-site"},
        ):
            refused = tc.post("/pauses/pause", data=form, headers=headers)
            assert refused.status_code == 403, headers
        purge = {"csrf_token": token, "reason": "x", "confirm_all": "all 1"}
        evil = {"origin": "http://rebind.attacker.example:8080"}
        assert tc.post("/dead/purge", data=purge, headers=evil).status_code == 403
        assert client.pauses() == [] and client.list_jobs("dead")
        # The dashboard's own origin is accepted.
        own = {"origin": "http://127.0.0.1:8080", "sec-fetch-site": "same-origin"}
        assert tc.post("/pauses/pause", data=form, headers=own).status_code == 200
        assert [p.value for p in client.pauses()] == ["mail"]
    with TestClient(_no_auth(dsn, schema)) as tc:  # the default without auth: loopback only
        assert tc.get("/").status_code == 421  # Host: testserver


def test_purge_or_replay_of_every_dead_job_needs_all_n(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    jobs = [_dead(client) for _ in range(3)]
    page = web.get("/dead")
    assert "all 3" in page.text and 'name="confirm_all"' in page.text
    token = _token(web, "/dead")
    for verb in ("purge", "replay"):
        for confirm in (None, "", "all", "all 2", "yes"):
            form = {"csrf_token": token, "reason": "cleanup"}
            if confirm is not None:
                form["confirm_all"] = confirm
            refused = web.post(f"/dead/{verb}", data=form)
            assert refused.status_code == 400 and "all 3" in refused.text, (verb, confirm)
    assert all(_status(dsn, schema, j) == "dead" for j in jobs)
    done = web.post(
        "/dead/purge", data={"csrf_token": token, "reason": "x", "confirm_all": "all 3"}
    )
    assert done.status_code == 200 and "purged 3 jobs" in done.text
    assert not rows(dsn, "SELECT 1 FROM {s}.jobs", schema)


def test_every_action_redirects_and_a_reload_repeats_nothing(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.schedule_add("hourly", task="t", every=3600, reason="new")
    token = _token(web, "/schedules")
    ran = web.post(
        "/schedules/hourly/run",
        data={"csrf_token": token, "reason": "now"},
        follow_redirects=False,
    )
    assert ran.status_code == 303 and ran.headers["location"] == "/schedules"
    assert ran.headers["x-frame-options"] == "DENY"
    first = web.get("/schedules")
    assert "job" in first.text and "enqueued" in first.text
    again = web.get("/schedules")  # the reload: a GET, and the message is gone
    assert "enqueued" not in again.text
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(1,)]
    job = _dead(client, queue="a")
    for path, form, target in (
        (f"/jobs/{job}/replay", {"reason": "x"}, f"/jobs/{job}"),
        (f"/jobs/{job}/cancel", {"reason": "x"}, f"/jobs/{job}"),
        ("/pauses/pause", {"scope": "queue", "value": "a", "reason": "x"}, "/pauses"),
        ("/pauses/resume", {"scope": "queue", "value": "a", "reason": "x"}, "/pauses"),
    ):
        done = web.post(path, data={"csrf_token": token, **form}, follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"] == target, path
    _dead(client, queue="b")
    bulk = web.post(
        "/dead/replay",
        data={"csrf_token": token, "reason": "x", "queue": "b"},
        follow_redirects=False,
    )
    assert bulk.status_code == 303 and bulk.headers["location"] == "/dead?queue=b"


@pytest.mark.parametrize(
    "payload",
    ["[" * 1100, '{"a":"\\ud800"}', '{"a": NaN}', '{"a": 1e999}', '{"a": Infinity}'],
)
def test_bad_payload_filters_are_400_without_postgresql_text(
    web: TestClient, client: leaseq.Client, payload: str
) -> None:
    client.enqueue("t", {"a": 1})
    page = web.get("/jobs", params={"payload": payload})
    assert page.status_code == 400 and 'class="flash error"' in page.text
    assert "jsonb" not in page.text and "psycopg" not in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


class _Broken(leaseq.AsyncClient):
    async def web_pauses(self) -> Any:
        raise RuntimeError("secret internal detail")


def test_an_unexpected_error_is_a_500_with_the_security_headers(dsn: str, schema: str) -> None:
    app = create_app(_Broken(dsn, schema=schema), auth=BasicAuth(*AUTH), close_client=True)
    with TestClient(app, headers=HEADERS) as tc:
        page = tc.get("/pauses")
        assert page.status_code == 500 and "secret internal detail" not in page.text
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_tokens_are_bound_to_the_session_and_shared_by_replicas(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    job = _dead(client)
    secret = b"shared-secret-of-the-replicas"
    with (
        TestClient(_app(dsn, schema, csrf_secret=secret), headers=HEADERS) as one,
        TestClient(_app(dsn, schema, csrf_secret=secret), headers=HEADERS) as two,
        TestClient(_app(dsn, schema), headers=HEADERS) as other,
    ):
        token = _token(one, f"/jobs/{job}")
        _token(two, f"/jobs/{job}")  # two's own session
        # one's token in two's session: refused (a leaked token is worthless elsewhere).
        refused = two.post(f"/jobs/{job}/replay", data={"csrf_token": token, "reason": "x"})
        assert refused.status_code == 403 and "session" in refused.text
        # The same session on another replica with the same secret: accepted.
        other.cookies.set(SESSION_COOKIE, str(one.cookies.get(SESSION_COOKIE)))
        own_secret = other.post(f"/jobs/{job}/replay", data={"csrf_token": token, "reason": "x"})
        assert own_secret.status_code == 403  # a different secret (per process)
        assert _status(dsn, schema, job) == "dead"
        two.cookies.set(SESSION_COOKIE, str(one.cookies.get(SESSION_COOKIE)))
        done = two.post(f"/jobs/{job}/replay", data={"csrf_token": token, "reason": "x"})
        assert done.status_code == 200 and _status(dsn, schema, job) == "pending"


def test_payload_filters_never_match_redacted_fields(
    web: TestClient, client: leaseq.Client
) -> None:
    job = int(client.enqueue("t", {"password": "hunter2", "user": 7}))
    for guess in ('{"password":"hunter2"}', '{"password":"hunter1"}'):
        page = web.get("/jobs", params={"payload": guess})
        assert page.status_code == 400 and "redacted" in page.text
        assert f'href="/jobs/{job}"' not in page.text
    found = web.get("/jobs", params={"payload": '{"user": 7}'})
    assert found.status_code == 200 and f'href="/jobs/{job}"' in found.text


def test_failed_logins_are_throttled(dsn: str, schema: str) -> None:
    app = _app(dsn, schema, throttle=Throttle(limit=3, window=3600))
    with TestClient(app) as tc:
        assert tc.get("/").status_code == 401  # no credentials: a challenge, not a failure
        for _ in range(3):
            assert tc.get("/", headers=_basic("ops", "guess")).status_code == 401
        held = tc.get("/", headers=HEADERS)  # the right password is held up too
        assert held.status_code == 429 and int(held.headers["retry-after"]) > 0
        assert held.headers["x-frame-options"] == "DENY"


def test_limits_page_runs_under_the_statement_timeout(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.set_limit("queue:mail", concurrency=3, reason="smtp")
    aclient = leaseq.AsyncClient(dsn, schema=schema)
    aclient.web_timeout_ms = 300
    app = create_app(aclient, auth=BasicAuth(*AUTH), close_client=True)
    with TestClient(app, headers=HEADERS) as tc, psycopg.connect(dsn) as blocker:
        page = tc.get("/limits")
        assert page.status_code == 200 and "queue:mail" in page.text, page.text
        blocker.execute(
            sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema))
        )
        slow = tc.get("/limits")
        assert slow.status_code == 503 and "statement timeout" in slow.text
        blocker.rollback()


def test_base_path_is_validated_and_cookies_are_secure_over_tls(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    with pytest.raises(ValueError, match="base-path"):
        _app(dsn, schema, base_path="//evil.example")
    forwarded = {**HEADERS, "x-forwarded-proto": "https"}

    def session_cookie(tc: TestClient, headers: dict[str, str]) -> str:
        page = tc.get("/pauses", headers=headers)
        (cookie,) = [c for c in page.headers.get_list("set-cookie") if SESSION_COOKIE in c]
        return cookie

    with TestClient(_app(dsn, schema)) as tc:  # forwarded headers not trusted
        assert "secure" not in session_cookie(tc, forwarded).lower()
    with TestClient(_app(dsn, schema, trust_forwarded=True)) as tc:
        cookie = session_cookie(tc, forwarded)
        assert re.search(r";\s*secure", cookie, re.I) and "httponly" in cookie.lower()
    with TestClient(_app(dsn, schema), base_url="https://testserver") as tc:
        assert re.search(r";\s*secure", session_cookie(tc, HEADERS), re.I)
    with TestClient(_app(dsn, schema, trust_forwarded=True)) as tc:
        assert "secure" not in session_cookie(tc, HEADERS).lower()
