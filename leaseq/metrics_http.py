"""A small HTTP endpoint for orchestration and scraping: /metrics, /healthz, /readyz.

/metrics answers in the format the scraper's Accept header asks for (OpenMetrics or the
Prometheus text format).

Runs in a daemon thread of its own, so a busy event loop or a slow database never makes a
scrape or a liveness probe hang the worker (and the other way round).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from leaseq.errors import ConfigError

log = logging.getLogger("leaseq.metrics_http")


class ObservabilityServer:
    """Serves ``registry`` at /metrics; /healthz answers while the process lives; /readyz
    answers 200 when ``ready()`` is true (the database is reachable), else 503."""

    def __init__(
        self,
        registry: Collector,
        *,
        port: int,
        host: str = "127.0.0.1",
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    # The format the scraper asks for (OpenMetrics or the text format).
                    encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
                    try:
                        body = encoder(outer.registry)
                    except Exception as exc:  # a failed scrape must say why, not crash
                        log.warning("metrics scrape failed: %s", exc)
                        self._send(503, f"scrape failed: {exc}\n".encode(), "text/plain")
                        return
                    self._send(200, body, content_type)
                elif path == "/healthz":
                    self._send(200, b"ok\n", "text/plain")
                elif path == "/readyz":
                    ok = outer._ready()
                    self._send(
                        200 if ok else 503,
                        b"ok\n" if ok else b"database unreachable\n",
                        "text/plain",
                    )
                else:
                    self._send(404, b"not found\n", "text/plain")

        self.registry = registry
        self._ready = ready
        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="leaseq-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ObservabilityServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
