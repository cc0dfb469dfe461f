"""The HTTP endpoints (docs/serve.md): handlers only read the monitor's snapshot, so a response never
waits on a probe, a GPU or NVML; every error answer is a health+json document with fixed words.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from probes import __version__
from probes.serve.metrics import HealthCollector
from probes.serve.monitor import Monitor
from probes.serve.view import UnknownCheck, verbose_text, verdict
from probes.untrusted import squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("healthcheck.serve")
HEALTH_JSON = "application/health+json"
ENDPOINTS = {"/livez": "liveness", "/readyz": "readiness", "/startupz": "startup"}


def error_body(reason: str, output: str) -> bytes:
    return json.dumps({"status": "fail", "version": __version__, "description": "healthcheck serve",
                       "output": output, "reason": reason, "notes": [], "checks": {}},
                      separators=(",", ":")).encode()


ERROR_BODY = error_body("internal-error", "internal error; see the server log")
NOT_FOUND_BODY = error_body("not-found", "unknown path; try " + ", ".join(
    [*ENDPOINTS, *(p + "/<check>" for p in ENDPOINTS), "/metrics"]))
# Requests refused before a handler runs.
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
    timeout = 5.0  # a client that sends nothing cannot hold a thread longer
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def parse_request(self) -> bool:
        # Only HTTP/1.x is served. The standard parser answers a line without a version (HTTP/0.9)
        # with a bare body, no status line, and passes HTTP/0.x on to a handler.
        words = bytes(getattr(self, "raw_requestline", b"")).split()
        if words and (len(words) != 3 or not HTTP_1.fullmatch(words[2])):
            self.command = self.requestline = ""
            versioned = len(words) == 2 or (len(words) == 3 and HTTP_ANY.fullmatch(words[2]))
            self.send_error(505 if versioned else 400)
            return False
        return super().parse_request()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every refused request: a status line always (HTTP/0.9 included), the standard reason
        phrase (the library's messages quote the request), then close."""
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # send_response writes no status line for 0.9
        self._send(code, HEALTH_JSON, REFUSED.get(code, REFUSED[400]), getattr(self, "command", "") == "HEAD",
                   close=True)

    def do_GET(self) -> None:
        head = self.command == "HEAD"
        try:
            path, _, query = self.path.partition("?")
            base, _, only = path.partition("/")[2].partition("/")
            if "/" + base in ENDPOINTS and (only or path == "/" + base):
                code, ctype, payload = self._health("/" + base, unquote(only) if only else None, query)
            elif path == "/metrics":
                encoder, ctype = choose_encoder(self.headers.get("Accept") or "")
                code, payload = 200, encoder(self.server.registry)
            else:
                code, ctype, payload = 404, HEALTH_JSON, NOT_FOUND_BODY
            self._send(code, ctype, payload, head)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass  # the client went away
        except Exception:
            log.exception("handler error for %s", squeeze(self.path, 100))
            with contextlib.suppress(OSError):
                self._send(500, HEALTH_JSON, ERROR_BODY, head)

    do_HEAD = do_GET

    def _health(self, endpoint: str, only: str | None, query: str) -> tuple[int, str, bytes]:
        args = parse_qs(query, keep_blank_values=True)
        exclude = [squeeze(n, 80) for n in args.get("exclude", [])[:32]]
        try:
            code, body = verdict(ENDPOINTS[endpoint], self.server.monitor.snap, now=time.time(),
                                 now_mono=time.monotonic(), gating=self.server.gating,
                                 only=None if only is None else squeeze(only, 80), exclude=exclude)
        except UnknownCheck as e:
            said = f"no check {e.args[0]!r} in {endpoint}; checks: {', '.join(e.args[1])}"
            return 404, HEALTH_JSON, error_body("not-found", squeeze(said))
        if "verbose" in args and "json" not in self.headers.get("Accept", ""):
            return code, "text/plain; charset=utf-8", verbose_text(endpoint.lstrip("/"), body).encode()
        return code, HEALTH_JSON, json.dumps(body, separators=(",", ":"), default=str).encode()

    def _send(self, code: int, ctype: str, payload: bytes, head: bool, close: bool = False) -> None:
        self.send_response(code)
        if close:
            self.send_header("Connection", "close")
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per request: a probe every few seconds would fill the log


class HealthServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], monitor: Monitor, *, gating: bool):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.monitor, self.gating = monitor, gating
        self.registry = CollectorRegistry(auto_describe=False)  # its own: no process or python collectors
        self.registry.register(HealthCollector(monitor))
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("http: error while handling a request")
