"""A port of a process's own for an operator's tooling: probes and Prometheus metrics.

`loopwright worker --metrics-port P` serves, on P (loopback unless `--metrics-host` says
otherwise), the same answers a server gives on its API port (`server.operating`):

* `GET /live`: 200 while the process answers;
* `GET /ready` (and `/health`): 200 when what the process works with answers, else 503;
* `GET /metrics`: loopwright's metrics in Prometheus' text format.

No token: the port is the boundary (keep it where only the scraper and the probes reach it),
as Prometheus' own exporters do. Bodies are a status word or the metrics, nothing else.
A plain threaded HTTP server: each request gets a thread, so a slow scrape never holds a probe.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from loopwright.readiness import LIVE, NOT_READY, READY, ReadinessLog

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ProbePort:
    """The probes and metrics of one process on `host`:`port`, served from a daemon thread
    until `close`. `down()` names what does not answer (empty: ready); `scrape()` is the
    metrics' exposition. Binding happens here: a port in use raises OSError at once."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        down: Callable[[], Mapping[str, str]],
        scrape: Callable[[], bytes],
    ) -> None:
        log = ReadinessLog()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.partition("?")[0]
                if path == "/live":
                    self._answer(200, LIVE)
                elif path in ("/ready", "/health"):
                    failing = down()
                    log.note(failing)
                    self._answer(503 if failing else 200, NOT_READY if failing else READY)
                elif path == "/metrics":
                    self._send(200, scrape(), METRICS_CONTENT_TYPE)
                else:
                    self._answer(404, {"detail": "not found"})

            def _answer(self, status: int, body: Mapping[str, Any]) -> None:
                self._send(status, json.dumps(body).encode(), "application/json")

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # a probe every few seconds is not news

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="probe-port", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
