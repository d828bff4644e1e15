"""The dashboard's pure parts, no database: the CSRF token, basic auth, what filters accept,
the sparkline, and `leaseq web` refusing to serve without auth off loopback."""

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
from leaseq.web import BasicAuth, create_app, forms
from leaseq.web.security import CSRF_COOKIE, Csrf


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": raw})


def test_csrf_token_is_signed_and_must_match_its_cookie() -> None:
    csrf = Csrf(b"k" * 32)
    token = csrf.issue()
    assert csrf.valid(token)
    nonce, signature = token.split(".")
    assert not csrf.valid(f"{nonce}x.{signature}")
    assert not csrf.valid(token + ".x") and not csrf.valid("") and not csrf.valid(None)
    assert not Csrf(b"other" * 8).valid(token)
    with_cookie = _request({"cookie": f"{CSRF_COOKIE}={token}"})
    assert csrf.check(with_cookie, token)
    assert not csrf.check(with_cookie, csrf.issue())  # ours, but not this cookie's
    assert not csrf.check(_request({}), token)  # no cookie: a cross-site form
    planted = Csrf(b"evil" * 8).issue()  # a cookie set by a sibling domain
    assert not csrf.check(_request({"cookie": f"{CSRF_COOKIE}={planted}"}), planted)


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
        ({"before": "١٢"}, "before must be a positive whole number"),
    ],
)
def test_bad_filter_input_is_one_clear_message(form: dict[str, str], message: str) -> None:
    with pytest.raises(forms.BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        forms.job_filters(form)


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


@dataclasses.dataclass(frozen=True)
class _Limit:
    name: str
    concurrency: int
    in_use: int | None


class _ClientWithLimits(leaseq.AsyncClient):
    async def limits(self) -> list[_Limit]:
        return [_Limit("queue:mail", 5, 2), _Limit("key:x", 1, None)]


class _ClientWithout(leaseq.AsyncClient):
    limits = None


def test_an_extra_page_appears_only_when_the_client_has_the_operation() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    with TestClient(create_app(_ClientWithLimits("postgresql://unused@127.0.0.1:1/x"))) as tc:
        page = tc.get("/limits")
        assert page.status_code == 200
        assert "queue:mail" in page.text
        assert 'href="/limits"' in page.text
    with TestClient(create_app(_ClientWithout("postgresql://unused@127.0.0.1:1/x"))) as tc:
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
