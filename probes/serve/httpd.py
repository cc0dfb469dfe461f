"""The HTTP endpoints: /livez, /readyz, /startupz (health+json, 200 or 503) and /metrics.

Handlers only read the monitor's in-memory snapshot, so a response never waits on a
probe, a GPU or NVML. Any error inside a handler answers 500 with a fixed body; the
detail goes to the log, never to the client.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from probes import __version__
from probes.serve import metrics
from probes.serve.monitor import Monitor
from probes.serve.view import verdict

log = logging.getLogger("healthcheck.serve")
HEALTH_JSON = "application/health+json"
ENDPOINTS = {"/livez": "liveness", "/readyz": "readiness", "/startupz": "startup"}
ERROR_BODY = b'{"status":"fail","reason":"internal-error","output":"internal error; see the server log"}'
NOT_FOUND_BODY = json.dumps({"status": "fail", "reason": "not-found", "output": "unknown path; try "
                             + ", ".join([*ENDPOINTS, "/metrics"])}).encode()
REQUEST_TIMEOUT = 5.0  # a client that sends nothing cannot hold a thread longer


class Handler(BaseHTTPRequestHandler):
    server: HealthServer
    server_version = "healthcheck/" + __version__
    sys_version = ""
    timeout = REQUEST_TIMEOUT
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def _answer(self, *, head: bool) -> None:
        try:
            path = self.path.split("?", 1)[0]
            if path in ENDPOINTS:
                profile = ENDPOINTS[path]
                code, body = verdict(profile, self.server.monitor.snapshot(), now=time.time(),
                                     now_mono=time.monotonic(), gating=self.server.gating,
                                     version=__version__)
                payload = json.dumps(body, separators=(",", ":"), default=str).encode()
                self._send(code, HEALTH_JSON, payload, head)
            elif path == "/metrics":
                self._send(200, metrics.CONTENT_TYPE, metrics.render(self.server.registry), head)
            else:
                self._send(404, HEALTH_JSON, NOT_FOUND_BODY, head)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass  # the client went away
        except Exception:
            log.exception("handler error for %s", self.path[:100])
            try:
                self._send(500, "application/json", ERROR_BODY, head)
            except OSError:
                pass

    def _send(self, code: int, ctype: str, payload: bytes, head: bool) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: %s %s", self.address_string(), format % args)


class HealthServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], monitor: Monitor, *, gating: bool):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.monitor = monitor
        self.gating = gating
        self.registry = metrics.registry_for(monitor)
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("http: error while handling a request")
