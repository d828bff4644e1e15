"""Metrics exposure: leaseq must not change prometheus_client for the application that
imports it, and /metrics speaks the format the scraper asks for."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from leaseq.metrics_http import ObservabilityServer

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def test_importing_leaseq_leaves_created_series_on_for_the_host_app() -> None:
    program = (
        "import leaseq, leaseq.metrics, leaseq.metrics_http, leaseq.cli, leaseq.worker\n"
        "from prometheus_client import CollectorRegistry, Counter, generate_latest\n"
        "registry = CollectorRegistry()\n"
        "Counter('host_requests', 'the host app', registry=registry).inc()\n"
        "print(generate_latest(registry).decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout
    assert "host_requests_created" in out, out


@pytest.fixture()
def server() -> Iterator[ObservabilityServer]:
    registry = CollectorRegistry()
    Counter("jobs_done", "jobs", registry=registry).inc()
    observer = ObservabilityServer(registry, port=0).start()
    yield observer
    observer.stop()


def _get(server: ObservabilityServer, accept: str | None) -> tuple[str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics")
    if accept is not None:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def test_openmetrics_accept_header_gets_openmetrics(server: ObservabilityServer) -> None:
    content_type, body = _get(server, OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text"), content_type
    assert body.endswith("# EOF\n") and "jobs_done_total 1.0" in body


def test_plain_scrape_gets_the_text_format(server: ObservabilityServer) -> None:
    content_type, body = _get(server, None)
    assert content_type.startswith("text/plain"), content_type
    assert "# EOF" not in body and "jobs_done_total 1.0" in body
