"""The HTTP endpoints: /livez, /readyz, /startupz (health+json, 200 or 503) and /metrics, with the
Kubernetes API server's ``?verbose``, ``/readyz/<check>`` and ``?exclude=`` (docs/serve.md).

Handlers only read the monitor's in-memory snapshot, so a response never waits on a
probe, a GPU or NVML. Any error inside a handler answers 500 with a fixed body; the
detail goes to the log, never to the client.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote

from probes import __version__
from probes.serve import metrics
from probes.serve.monitor import Monitor
from probes.serve.view import UnknownCheck, verbose_text, verdict
from probes.untrusted import squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("healthcheck.serve")
HEALTH_JSON = "application/health+json"
TEXT = "text/plain; charset=utf-8"
ENDPOINTS = {"/livez": "liveness", "/readyz": "readiness", "/startupz": "startup"}
MAX_EXCLUDES = 32
REQUEST_TIMEOUT = 5.0  # a client that sends nothing cannot hold a thread longer


def error_body(reason: str, output: str) -> bytes:
    """A health+json document for an error answer (404, 500): the same media type and shape."""
    return json.dumps({"status": "fail", "version": __version__, "description": "healthcheck serve",
                       "output": output, "reason": reason, "notes": [], "checks": {}},
                      separators=(",", ":")).encode()


# Fixed: a handler error must not depend on anything that could fail again.
ERROR_BODY = error_body("internal-error", "internal error; see the server log")
NOT_FOUND_BODY = error_body("not-found", "unknown path; try " + ", ".join(
    [*ENDPOINTS, *(p + "/<check>" for p in ENDPOINTS), "/metrics"]))
# Requests refused before a handler runs: fixed words, nothing of the request echoed.
REFUSED = {
    400: error_body("bad-request", "malformed request line; send GET <path> HTTP/1.1"),
    414: error_body("uri-too-long", "request line too long"),
    431: error_body("headers-too-large", "request header fields too long or too many"),
    501: error_body("not-implemented", "method not served; use GET or HEAD"),
    505: error_body("http-version-not-supported", "HTTP version not served; use HTTP/1.0 or HTTP/1.1"),
}
HTTP_1 = re.compile(rb"HTTP/1\.[0-9]")
HTTP_ANY = re.compile(rb"HTTP/[0-9]+\.[0-9]+")


class Handler(BaseHTTPRequestHandler):
    server: HealthServer
    server_version = "healthcheck/" + __version__
    sys_version = ""
    timeout = REQUEST_TIMEOUT
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def parse_request(self) -> bool:
        # Only HTTP/1.x is served. The standard parser answers a line without a version
        # (HTTP/0.9) with a bare body, no status line, and passes HTTP/0.x on to a handler.
        words = bytes(getattr(self, "raw_requestline", b"")).split()
        if words and (len(words) != 3 or not HTTP_1.fullmatch(words[2])):
            self.command, self.requestline = "", ""
            self.send_error(505 if len(words) == 2 or (len(words) == 3 and HTTP_ANY.fullmatch(words[2]))
                            else 400)
            return False
        return super().parse_request()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every refused request: health+json, a status line always (HTTP/0.9 included), the
        standard reason phrase (the library's messages quote the request), then close."""
        body = REFUSED.get(code, REFUSED[400])
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # send_response writes no status line for 0.9
        self.close_connection = True
        self.send_response(code)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", HEALTH_JSON)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if getattr(self, "command", "") != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def _answer(self, *, head: bool) -> None:
        try:
            path, _, query = self.path.partition("?")
            base, _, only = path.partition("/")[2].partition("/")
            base = "/" + base
            if base in ENDPOINTS and (only or path == base):
                self._health(base, unquote(only) if only else None, query, head)
            elif path == "/metrics":
                payload, ctype = metrics.render(self.server.registry, self.headers.get("Accept"))
                self._send(200, ctype, payload, head)
            else:
                self._send(404, HEALTH_JSON, NOT_FOUND_BODY, head)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass  # the client went away
        except Exception:
            log.exception("handler error for %s", self.path[:100])
            try:
                self._send(500, HEALTH_JSON, ERROR_BODY, head)
            except OSError:
                pass

    def _health(self, endpoint: str, only: str | None, query: str, head: bool) -> None:
        args = parse_qs(query, keep_blank_values=True)
        exclude = [squeeze(n, 80) for n in args.get("exclude", [])[:MAX_EXCLUDES]]
        try:
            code, body = verdict(ENDPOINTS[endpoint], self.server.monitor.snapshot(), now=time.time(),
                                 now_mono=time.monotonic(), gating=self.server.gating, version=__version__,
                                 only=None if only is None else squeeze(only, 80), exclude=exclude)
        except UnknownCheck as e:
            known = ", ".join(e.known) or "none yet"
            self._send(404, HEALTH_JSON, error_body("not-found", squeeze(
                f"no check {e.name!r} in {endpoint}; checks: {known}")), head)
            return
        accept = self.headers.get("Accept", "")
        if "verbose" in args and "json" not in accept:
            self._send(code, TEXT, verbose_text(endpoint.lstrip("/"), body).encode(), head)
        else:
            self._send(code, HEALTH_JSON, json.dumps(body, separators=(",", ":"), default=str).encode(), head)

    def _send(self, code: int, ctype: str, payload: bytes, head: bool) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: %s %s", self.address_string(), squeeze(format % args, 300))


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
