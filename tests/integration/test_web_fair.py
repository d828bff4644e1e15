"""The dashboard's per-key view of fair queues on a real PostgreSQL (Starlette's TestClient):
a fair queue's page and its keys page list the keys by backlog with weight, running, share
and parked; the weight form sets a weight through the audited client operation (the user
as the actor), and is refused without a CSRF token, in read-only mode, by the authorize
hook, or with a bad weight (a message, a 4xx, nothing changed). The real-browser run is in
tests/acceptance/test_web_browser.py."""

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

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import leaseq
from leaseq.web import BasicAuth, create_app
from tests.support.helpers import rows

AUTH = ("ops", "s3cret")
HEADERS = {"authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}


def _app(dsn: str, schema: str, **kw: Any) -> Starlette:
    kw.setdefault("auth", BasicAuth(*AUTH))
    return create_app(leaseq.AsyncClient(dsn, schema=schema), close_client=True, **kw)


@pytest.fixture()
def web(dsn: str, schema: str) -> Iterator[TestClient]:
    with TestClient(_app(dsn, schema), headers=HEADERS) as tc:
        yield tc


def _token(tc: TestClient, path: str) -> str:
    page = tc.get(path)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None, "no CSRF field on " + path
    return found.group(1)


def _fill(client: leaseq.Client) -> None:
    client.enqueue_many([{"task": "t", "fairness_key": "big"} for _ in range(30)])
    client.enqueue_many([{"task": "t", "fairness_key": "small"} for _ in range(3)])
    client.enqueue("t")  # no key: the key ''


def _weights(dsn: str, schema: str) -> dict[str, float]:
    return dict(rows(dsn, "SELECT fairness_key, weight FROM {s}.fair_keys", schema))


def test_a_fair_queue_shows_its_keys_by_backlog(web: TestClient, client: leaseq.Client) -> None:
    _fill(client)
    queue = web.get("/queues/default").text
    assert "Fairness keys" in queue and "All keys of default" in queue
    page = web.get("/queues/default/keys")
    assert page.status_code == 200
    cells = re.findall(
        r"<tr><td>(.*?)</td>\s*<td class=\"n\">([^<]*)</td>"
        r"<td class=\"n\">(\d+)</td>",
        page.text,
    )
    assert [(c[1], c[2]) for c in cells] == [("1", "30"), ("1", "3"), ("1", "1")]
    assert "big" in cells[0][0] and "small" in cells[1][0] and "no key" in cells[2][0]
    assert "33.3 %" in page.text
    plain = web.get("/queues/plain/keys").text
    assert "has no fairness keys" in plain
    assert "Fairness keys" not in web.get("/queues/plain").text


def test_a_weight_is_set_audited_with_the_user(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    _fill(client)
    token = _token(web, "/queues/default/keys")
    form = {"csrf_token": token, "key": "big", "weight": "3", "reason": "enterprise"}
    done = web.post("/queues/default/keys/weight", data=form)
    assert done.status_code == 200 and "key &#39;big&#39;: weight 3" in done.text
    assert _weights(dsn, schema)["big"] == 3.0
    (event,) = [e for e in client.admin_events() if e.action == "fair_weight"]
    assert (event.actor, event.reason, event.value) == ("web:ops", "enterprise", "default/big")
    keyless = web.post("/queues/default/keys/weight", data={**form, "key": "", "weight": "2"})
    assert keyless.status_code == 200 and _weights(dsn, schema)[""] == 2.0


def test_bad_weights_and_refusals_change_nothing(
    web: TestClient, client: leaseq.Client, dsn: str, schema: str
) -> None:
    _fill(client)
    token = _token(web, "/queues/default/keys")
    path = "/queues/default/keys/weight"
    for bad in ("0", "-1", "nan", "x", "", "1e9"):
        page = web.post(path, data={"csrf_token": token, "key": "big", "weight": bad})
        assert page.status_code == 400, (bad, page.status_code)
    forged = web.post(path, data={"csrf_token": "forged.x", "key": "big", "weight": "2"})
    assert forged.status_code == 403
    assert _weights(dsn, schema)["big"] == 1.0
    with TestClient(_app(dsn, schema, read_only=True), headers=HEADERS) as tc:
        page = tc.get("/queues/default/keys").text
        assert "Set weight" not in page
    deny = _app(dsn, schema, authorize=lambda user, action: action != "weight")
    with TestClient(deny, headers=HEADERS) as tc:
        token = _token(tc, "/pauses")
        refused = tc.post(path, data={"csrf_token": token, "key": "big", "weight": "2"})
        assert refused.status_code == 403 and "not allowed" in refused.text
    assert _weights(dsn, schema)["big"] == 1.0
    assert [e for e in client.admin_events() if e.action == "fair_weight"] == []


def test_the_keys_page_runs_under_the_statement_timeout(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    # A key's backlog is a count of its jobs: the page reads it under the dashboard's
    # statement timeout (web_fair_keys), so a slow count is a 503 message, not a hung page.
    _fill(client)
    aclient = leaseq.AsyncClient(dsn, schema=schema)
    aclient.web_timeout_ms = 300
    app = create_app(aclient, auth=BasicAuth(*AUTH), close_client=True)
    with TestClient(app, headers=HEADERS) as tc, psycopg.connect(dsn) as blocker:
        assert "big" in tc.get("/queues/default/keys").text
        blocker.execute(
            sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema))
        )
        slow = tc.get("/queues/default/keys")
        assert slow.status_code == 503 and "statement timeout" in slow.text
        blocker.rollback()
