"""The dashboard's pure parts, no database: the session-bound CSRF token, the flash
message, basic auth and its throttle, the Host allow-list and the cross-site check, the
base path, what filters accept, the sparkline, and `leaseq web` refusing to serve without
auth (or with a short password) off loopback."""

from __future__ import annotations

import base64
import dataclasses
import pathlib
import sys
import warnings

import pytest

pytest.importorskip("starlette")

from starlette.requests import Request

import leaseq
from leaseq.cli import main
from leaseq.cli.web import MISSING_EXTRA, credentials, is_loopback
from leaseq.errors import ConfigError
from leaseq.redact import default_redact
from leaseq.web import BasicAuth, create_app, forms
from leaseq.web.security import (
    SESSION_COOKIE,
    Csrf,
    HostPolicy,
    Throttle,
    check_base_path,
    cross_site,
    host_name,
    secret_from_env,
)


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": raw})


class _Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_csrf_token_is_bound_to_its_session_and_user_and_expires() -> None:
    clock = _Clock()
    csrf = Csrf(b"k" * 32, ttl=3600, clock=clock)
    session = csrf.new_session()
    token = csrf.issue(session, "ops")
    assert csrf.verdict(session, "ops", token) is None
    issued, signature = token.split(".")
    assert csrf.verdict(session, "ops", f"{int(issued) + 1}.{signature}")  # time tampered
    assert csrf.verdict(csrf.new_session(), "ops", token)  # another browser's session
    assert csrf.verdict(session, "eve", token)  # another user
    assert csrf.verdict(None, "ops", token)  # no session cookie: a cross-site form
    assert csrf.verdict(session, "ops", None) and csrf.verdict(session, "ops", "x.y.z")
    assert Csrf(b"other" * 8, clock=clock).verdict(session, "ops", token)  # not our secret
    # The same secret (LEASEQ_WEB_SECRET on every replica) accepts it: restarts too.
    assert Csrf(b"k" * 32, clock=clock).verdict(session, "ops", token) is None
    clock.now += 3599
    assert csrf.verdict(session, "ops", token) is None
    clock.now += 2
    expired = csrf.verdict(session, "ops", token)
    assert expired is not None and "expired" in expired
    with pytest.raises(ValueError):
        Csrf(b"short")
    cookie = _request({"cookie": f"{SESSION_COOKIE}={session}"})
    assert Csrf.session_of(cookie) == session
    assert Csrf.session_of(_request({"cookie": f"{SESSION_COOKIE}=a;b"})) is None


def test_flash_messages_are_signed() -> None:
    csrf = Csrf(b"k" * 32)
    value = csrf.sign_flash("ok", "replayed 3 jobs")
    assert csrf.read_flash(value) == ("ok", "replayed 3 jobs")
    body, signature = value.split(".")
    assert csrf.read_flash(body + "." + "0" * len(signature)) is None  # a forged message
    assert Csrf(b"x" * 32).read_flash(value) is None
    assert csrf.read_flash("junk") is None and csrf.read_flash(None) is None


def test_secret_from_the_environment() -> None:
    assert secret_from_env({}) is None
    assert secret_from_env({"LEASEQ_WEB_SECRET": "s" * 32}) == b"s" * 32
    with pytest.raises(ValueError, match="at least 16"):
        secret_from_env({"LEASEQ_WEB_SECRET": "short"})


def test_host_allow_list() -> None:
    assert host_name("Example.ORG:8080") == "example.org"
    assert host_name("[::1]:80") == "::1" and host_name("127.0.0.1") == "127.0.0.1"
    for bad in (None, "", "a b", "x:y", "[::1", "[zz]:1", "évil.example", "a" * 400):
        assert host_name(bad) is None, bad
    loop = HostPolicy(["127.0.0.1", "localhost", "::1"])
    assert loop.allows("127.0.0.1:8080") and loop.allows("localhost:8080")
    assert loop.allows("[::1]:8080")
    assert not loop.allows("rebind.attacker.example:8080") and not loop.allows("10.0.0.5")
    wildcard = HostPolicy(["0.0.0.0", "queue.example.org"])
    assert wildcard.allows("10.0.0.5:8080") and wildcard.allows("queue.example.org")
    assert not wildcard.allows("[fe80::1]:8080") and not wildcard.allows("evil.example")
    assert HostPolicy(["::"]).allows("[fe80::1]") and HostPolicy(["*"]).allows("any.example")
    with pytest.raises(ValueError):
        HostPolicy(["bad host"])


def test_cross_site_posts_are_refused() -> None:
    host = {"host": "127.0.0.1:8080"}
    assert cross_site("GET", {**host, "sec-fetch-site": "cross-site"}, "http") is None
    assert cross_site("POST", host, "http") is None  # curl: the CSRF token decides
    assert cross_site("POST", {**host, "origin": "http://127.0.0.1:8080"}, "http") is None
    assert cross_site("POST", {**host, "sec-fetch-site": "same-origin"}, "http") is None
    for refused in (
        {"origin": "https://evil.example"},
        {"origin": "null"},
        {"origin": "http://127.0.0.1:9999"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
    ):
        assert cross_site("POST", {**host, **refused}, "http") is not None, refused
    # Default ports are the same origin whether or not they are written.
    assert (
        cross_site("POST", {"host": "q.example", "origin": "https://q.example:443"}, "https")
        is None
    )


def test_failed_logins_are_throttled_per_client() -> None:
    clock = _Clock()
    throttle = Throttle(limit=3, window=60, clock=clock)
    for _ in range(3):
        assert throttle.retry_after("1.2.3.4") is None
        throttle.failed("1.2.3.4")
    wait = throttle.retry_after("1.2.3.4")
    assert wait is not None and 0 < wait <= 60
    assert throttle.retry_after("5.6.7.8") is None  # another client is not held up
    clock.now += 61
    assert throttle.retry_after("1.2.3.4") is None
    throttle.failed("1.2.3.4")
    throttle.succeeded("1.2.3.4")
    assert throttle.retry_after("1.2.3.4") is None
    small = Throttle(limit=1, max_clients=2, clock=clock)
    for client in ("a", "b", "c"):
        small.failed(client)
    assert small.retry_after("a") is None and small.retry_after("c") is not None


def test_base_path_is_checked() -> None:
    assert check_base_path("") == "" and check_base_path("/") == ""
    assert check_base_path("/ops/queue/") == "/ops/queue"
    for bad in ("//evil.example", "ops", "/a/../b", "/a//b", "/a b", "/%2e", "/" + "a" * 300):
        with pytest.raises(ValueError):
            check_base_path(bad)


def _basic(value: str) -> Request:
    return _request({"authorization": "Basic " + base64.b64encode(value.encode()).decode()})


def test_basic_auth_accepts_only_the_exact_pair() -> None:
    auth = BasicAuth("ops", "pw:with:colons")
    assert auth(_basic("ops:pw:with:colons")) == "ops"
    for wrong in ("ops:pw", "ops:", "op:pw:with:colons", "ops", ":pw:with:colons"):
        assert auth(_basic(wrong)) is None
    assert auth(_request({"authorization": "Basic ***"})) is None
    assert auth(_request({"authorization": "Bearer abc"})) is None
    assert auth(_request({})) is None
    with pytest.raises(ValueError):
        BasicAuth("ops", "")
    with pytest.raises(ValueError):
        BasicAuth("a:b", "pw")


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"queue": "x" * 5000}, "queue is too long (5000 characters, at most 200)"),
        ({"task": "a\x00b"}, "task contains control characters"),
        ({"state": "exploded"}, "unknown state 'exploded'"),
        ({"payload": "[1"}, "payload filter must be a JSON object"),
        ({"payload": "7"}, "payload filter must be a JSON object"),
        ({"payload": '{"a": "\\u0000"}'}, "payload filter contains a NUL character"),
        ({"before": "-1"}, "before must be a positive whole number"),
        ({"payload": "[" * 1100}, "nests deeper than 20"),
        ({"payload": '{"a": ' * 30 + "1" + "}" * 30}, "nests deeper than 20"),
        ({"payload": '{"a": "\\ud800"}'}, "lone surrogate"),
        ({"payload": '{"a": NaN}'}, "NaN is not a JSON number"),
        ({"payload": '{"a": -Infinity}'}, "-Infinity is not a JSON number"),
        ({"payload": '{"a": 1e999}'}, "1e999 is out of range"),
        ({"queue": "\ud800"}, "queue is not valid Unicode"),
        ({"before": "١٢"}, "before must be a positive whole number"),
    ],
)
def test_bad_filter_input_is_one_clear_message(form: dict[str, str], message: str) -> None:
    with pytest.raises(forms.BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        forms.job_filters(form)


def test_payload_filters_never_match_redacted_fields() -> None:
    redact = default_redact
    for hidden in ('{"password": "hunter2"}', '{"api_key": "x"}', '[{"token": "abc"}]'):
        with pytest.raises(forms.BadInput, match="redacted"):
            forms.job_filters({"payload": hidden}, redact)
    assert forms.job_filters({"payload": '{"user": 7}'}, redact)["payload"] == '{"user": 7}'
    assert forms.job_filters({"payload": '{"password": "x"}'})["payload"]  # no hook, no mask


def test_harmless_odd_filter_input_passes_as_data() -> None:
    found = forms.job_filters(
        {"queue": "' OR 1=1 --", "task": "100%_done", "error_code": "✓💥", "payload": '{"a":1}'}
    )
    assert found["queue"] == "' OR 1=1 --" and found["task"] == "100%_done"
    assert found["error_code"] == "✓💥" and found["payload"] == '{"a": 1}'
    assert forms.job_filters({"queue": "  "})["queue"] is None


def test_sparkline_is_an_inline_svg_without_style() -> None:
    svg = str(forms.sparkline([0] * 59 + [5]))
    assert svg.startswith("<svg") and "style=" not in svg and "<script" not in svg
    points = svg.split('points="')[1].split('"')[0].split()
    assert len(points) == 60 and points[-1].endswith(",1.0")  # the peak at the top
    assert "max 1" in str(forms.sparkline([]))


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")


def test_leaseq_web_refuses_a_public_bind_without_auth(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASEQ_WEB_USER", raising=False)
    monkeypatch.delenv("LEASEQ_WEB_PASSWORD", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["web", "--host", "0.0.0.0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to serve the dashboard on 0.0.0.0" in err
    monkeypatch.setenv("LEASEQ_WEB_USER", "ops")
    with pytest.raises(SystemExit) as exited:
        main(["web", "--host", "0.0.0.0"])
    assert exited.value.code == 2
    assert "set both LEASEQ_WEB_USER and LEASEQ_WEB_PASSWORD" in capsys.readouterr().err
    monkeypatch.setenv("LEASEQ_WEB_PASSWORD", "x")
    with pytest.raises(SystemExit) as exited:
        main(["web", "--host", "0.0.0.0"])
    assert exited.value.code == 2
    assert "at least 12 characters when serving on 0.0.0.0" in capsys.readouterr().err
    monkeypatch.setenv("LEASEQ_WEB_PASSWORD", "long enough password")
    for args, said in (
        (["--base-path", "//evil.example"], "--base-path must be a path"),
        (["--allowed-host", "bad host"], "--allowed-host: not a host name"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["web", "--host", "0.0.0.0", *args])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err


@dataclasses.dataclass(frozen=True)
class _Limit:
    name: str
    concurrency: int
    in_use: int | None


class _ClientWithLimits(leaseq.AsyncClient):
    async def web_limits(self) -> list[_Limit]:  # type: ignore[override]
        return [_Limit("queue:mail", 5, 2), _Limit("key:x", 1, None)]


_NOWHERE = "postgresql://unused@127.0.0.1:1/x"


class _ClientWithout(leaseq.AsyncClient):
    limits = None


def test_an_extra_page_appears_only_when_the_client_has_the_operation() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    with TestClient(create_app(_ClientWithLimits(_NOWHERE), allowed_hosts=["testserver"])) as tc:
        page = tc.get("/limits")
        assert page.status_code == 200
        assert "queue:mail" in page.text
        assert 'href="/limits"' in page.text
    with TestClient(create_app(_ClientWithout(_NOWHERE), allowed_hosts=["testserver"])) as tc:
        assert tc.get("/limits").status_code == 404


def test_create_app_refuses_a_sync_client() -> None:
    with pytest.raises(TypeError, match="AsyncClient"):
        create_app(leaseq.Client("postgresql://unused@127.0.0.1:1/x"))  # type: ignore[arg-type]


def test_password_file_and_missing_extra_are_one_line_errors(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: pathlib.Path,
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    assert credentials("ops", str(secret)) == ("ops", "hunter2")
    with pytest.raises(ConfigError, match="go together"):
        credentials("ops", None)
    with pytest.raises(ConfigError, match="cannot read --password-file"):
        credentials("ops", str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="password is empty"):
        credentials("ops", str(tmp_path / "empty"))
    monkeypatch.delenv("LEASEQ_WEB_USER", raising=False)
    monkeypatch.delenv("LEASEQ_WEB_PASSWORD", raising=False)
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # the extra is not installed
    with pytest.raises(SystemExit) as exited:
        main(["web"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"leaseq: error: {MISSING_EXTRA}\n"
