"""The HTTP endpoints and /metrics (docs/serve.md): handlers and scrapes only read the monitor's
snapshot, so an answer never waits on a probe, a GPU or NVML."""

from __future__ import annotations

import contextlib
import json
import logging
import platform
import re
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from probes import __version__
from probes.hardware import xids
from probes.serve import PROFILES
from probes.serve.monitor import Monitor
from probes.serve.view import Snapshot, UnknownCheck, check_name, verbose_text, verdict
from probes.spec import STATUSES
from probes.untrusted import squeeze

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
REFUSED = {  # requests refused before a handler runs
    400: error_body("bad-request", "malformed request line; send GET <path> HTTP/1.1"),
    414: error_body("uri-too-long", "request line too long"),
    431: error_body("headers-too-large", "request header fields too long or too many"),
    501: error_body("not-implemented", "method not served; use GET or HEAD"),
    505: error_body("http-version-not-supported", "HTTP version not served; use HTTP/1.0 or HTTP/1.1"),
}
WATCHER_STATES = ("running", "starting", "unavailable", "failed", "off")
SUFFIX = {"counter": "_total", "info": "_info"}


def action(kind: str, xid: str) -> str:
    """What an event needs, whatever serve's latch policy says (docs/serve.md's metrics table)."""
    if kind == "xid":
        return xids.bucket(int(xid)).label if xid.isdigit() and len(xid) < 6 else "unknown"
    return xids.BUCKETS[xids.RESET_GPU].label if kind == "ecc-double" else "none"


def _facts(snap: Snapshot, probe: str) -> dict[str, Any]:
    for run in (snap.runs.get("readiness"), snap.runs.get("startup")):
        for key, entries in (run.report if run and run.report else {}).get("checks", {}).items():
            if check_name(key) == probe and entries:
                return entries[0].get("facts") or {}
    return {}


def family(name: str, doc: str, labels: tuple[str, ...], rows: Any, kind: str = "gauge") -> Metric:
    """A family of the exposition: a sample of each row, its label values then its value."""
    metric = Metric(name, doc, kind)
    for *values, value in rows:
        metric.add_sample(name + SUFFIX.get(kind, ""), dict(zip(labels, values)), float(value))
    return metric


def families(snap: Snapshot) -> list[Metric]:
    now, mono = time.time(), time.monotonic()
    bodies = {p: verdict(p, snap, now=now, now_mono=mono) for p in PROFILES}
    runs = [(p, snap.runs[p]) for p in PROFILES if p in snap.runs]
    checks = [(p, check_name(k), es[0]["status"], es[0].get("elapsed") or 0.0) for p, r in runs if r.report
              for k, es in r.report["checks"].items() if es]
    checks += [(p, check_name(k), "skip", 0.0) for p, r in runs if r.report for k in r.report["skipped"]]
    reasons: list[tuple[Any, ...]] = []  # the reason of each check that is not passing, once
    for p, (_, body) in bodies.items():
        for key, e in [*((k, es[0]) for k, es in body["checks"].items() if es and es[0]["status"] != "pass"),
                       *body.get("skipped", {}).items()]:
            row = (p, check_name(key), *(str(e.get(k) or "")[:40] for k in ("reason", "action", "actor")), 1)
            reasons += [row] if e.get("reason") and row not in reasons else []
    gpus = _facts(snap, "nvml").get("gpus") or []
    uuids = {str(g["index"]): g["uuid"] for g in gpus if g.get("uuid")}
    uuids.update({str(e.gpu): e.uuid for e in snap.events if e.gpu is not None and e.uuid})
    torch = str(_facts(snap, "torch-cuda").get("torch") or "")
    latch, profile, probe = snap.latch, ("profile",), ("profile", "probe")
    return [  # docs/serve.md's table says more of each
        family("healthcheck_healthy", "1 if the profile's endpoint would answer 200 (before gating)",
               profile, ((p, bodies[p][0] == 200) for p in PROFILES)),
        family("healthcheck_result_age_seconds", "Age of the profile's latest result",
               profile, ((p, max(0.0, mono - r.finished_mono)) for p, r in runs)),
        family("healthcheck_result_stale", "1 if the latest result is older than interval + slack",
               profile, ((p, bodies[p][1]["reason"] == "stale") for p, _ in runs)),
        family("healthcheck_run_duration_seconds", "Wall time of the profile's latest run",
               profile, ((p, r.duration) for p, r in runs)),
        family("healthcheck_probe_status", "1 for the probe's status in the latest run of the profile",
               (*probe, "status"), ((p, n, s, s == got) for p, n, got, _ in checks for s in STATUSES)),
        # As kube-state-metrics' *_reason series: one per reason while it holds, so an alert can name it
        # without its own series changing; actor and action (the catalog's) route it to whoever can act.
        family("healthcheck_probe_reason", "1 for the reason of each check that is not passing, with who can "
               "act (actor) and how (action)", (*probe, "reason", "action", "actor"), reasons),
        family("healthcheck_probe_duration_seconds", "Time the probe took in the latest run",
               probe, ((p, n, t) for p, n, _, t in checks)),
        family("healthcheck_probe_last_success_timestamp_seconds", "When the probe last passed or warned",
               probe, ((*k, t) for k, t in sorted(snap.last_success.items()))),
        family("healthcheck_runs", "Runs of each profile by outcome (pass, warn, fail, or why no report)",
               ("profile", "outcome"), ((*k, n) for k, n in sorted(snap.runs_total.items())), "counter"),
        # One unlabelled series that a latch never swaps for another; its source is in healthcheck_latch_info.
        family("healthcheck_latched", "1 while the container is latched unhealthy until it restarts",
               (), [(latch is not None,)]),
        family("healthcheck_latch", "Why the container is latched (present only while latched)",
               ("source", "code"), [(str(latch.get("source") or "unknown")[:80],
                                     str(latch.get("code") or "latched")[:40], 1)] if latch else [], "info"),
        family("healthcheck_nvml_events", "NVML events seen while serving, with the action each needs",
               ("gpu", "UUID", "kind", "xid", "severity", "action"), (
                   (gpu, uuids.get(gpu, ""), kind, xid, sev, action(kind, xid), n)
                   for (gpu, kind, xid, sev), n in sorted(snap.event_counts.items())), "counter"),
        family("healthcheck_nvml_event_watch", "1 for the state of the NVML Xid/ECC event watcher",
               ("state",), ((s, snap.watcher == s) for s in WATCHER_STATES)),
        family("healthcheck_build", "The suite's version, its Python, and the torch that torch-cuda found",
               ("version", "python", "torch"), [(__version__, platform.python_version(), torch, 1)], "info"),
        family("healthcheck_gpu_up", "1 if NVML answered for the GPU in the last readiness (or startup) run",
               ("gpu", "UUID", "modelName"),
               ((str(g["index"]), g.get("uuid", ""), g.get("name", ""), bool(g.get("ok"))) for g in gpus)),
    ]


class Handler(BaseHTTPRequestHandler):
    server: HealthServer
    raw_requestline: bytes
    server_version = "healthcheck/" + __version__
    timeout = 5.0  # a client that sends nothing cannot hold a thread longer
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def parse_request(self) -> bool:
        # Only HTTP/1.x is served. The standard parser answers a line without a version (HTTP/0.9)
        # with a bare body, no status line, and passes HTTP/0.x on to a handler.
        words = self.raw_requestline.split()
        if words and (len(words) != 3 or not re.fullmatch(rb"HTTP/1\.\d", words[2])):
            # 1.0 for the answer's status line: send_response writes none for 0.9
            self.command, self.requestline, self.request_version = "", "", "HTTP/1.0"
            versioned = len(words) == 2 or (len(words) == 3 and re.fullmatch(rb"HTTP/\d+\.\d+", words[2]))
            self.send_error(505 if versioned else 400)
            return False
        return super().parse_request()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Never the library's text: it quotes the request."""
        self._send(code, HEALTH_JSON, REFUSED.get(code, REFUSED[400]), close=True)

    def do_GET(self) -> None:
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
            self._send(code, ctype, payload)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass  # the client went away
        except Exception:
            log.exception("handler error for %s", squeeze(self.path, 100))
            with contextlib.suppress(OSError):
                self._send(500, HEALTH_JSON, ERROR_BODY)

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

    def _send(self, code: int, ctype: str, payload: bytes, close: bool = False) -> None:
        self.send_response(code)
        if close:
            self.send_header("Connection", "close")
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per request: a probe every few seconds would fill the log


class HealthServer(ThreadingHTTPServer):  # its threads daemons, its address reusable, as the base's
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], monitor: Monitor, *, gating: bool):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.monitor, self.gating = monitor, gating
        self.registry = CollectorRegistry(auto_describe=False)  # its own: no process or python collectors
        self.registry.register(self)
        super().__init__(address, Handler)

    def collect(self) -> list[Metric]:
        return families(self.monitor.snap)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("http: error while handling a request")
