"""The shipped rules on the real monitoring stack: Debian's Prometheus scrapes a real `healthcheck
serve` and evaluates k8s/alerting/rules.yaml; Debian's Alertmanager delivers to a webhook that
the test runs. While every probe passes nothing fires (or is pending); a sticky CUDA error
inside the real torch worker (CPU torch, the error raised as CUDA words it, as in
`make gpu-verify FAKE=1`) pages with its labels and runbook link intact. Everything listens on
loopback, keeps its data in the test's own directory, and is stopped at the end."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.alerting import promql
from tests.alerting.conftest import RULES, label_domains, rules, tool
from tests.conftest import ROOT, clean_env
from tests.fakes.nvidia_smi_stub import write_stub
from tests.serve.conftest import Server, marked_pids, watch_env, write_exe
from tests.servers import free_port

FAULT_PYTHON = ROOT / "tests" / "gpu" / "fault-python.sh"
TARGET = {"namespace": "ml", "pod": "gpu-dev-0", "container": "gpu-dev"}  # as a PodMonitor would add
POISONED = "HealthcheckCudaContextPoisoned"


class Webhook(http.server.ThreadingHTTPServer):
    """Alertmanager's webhook receiver: keeps every notification it is sent."""

    daemon_threads = True

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook.lock:
                    hook.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict[str, Any]]:
        with self.lock:
            return [a for n in self.received for a in n["alerts"]]


def get(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read()) if "json" in resp.headers.get("Content-Type", "") else resp.read()


def until(what: str, check: Any, timeout: float, logs: list[Path]) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.25)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"{what}: not within {timeout} s\n{tails}")


class Daemon:
    """A Prometheus or Alertmanager process of the test's own: its own session, its log in a file."""

    def __init__(self, argv: list[str], log: Path, marker: str):
        self.log = log
        self._fh = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, cwd=log.parent, env=clean_env(HC_SERVE_TEST=marker),
                                     stdin=subprocess.DEVNULL, stdout=self._fh, stderr=self._fh,
                                     start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._fh.close()


def serve_env(tmp_path: Path, fake_nvml: Path, fault: Path) -> dict[str, str]:
    """nvidia-smi, NVML (fake library, real bindings) and torch-cuda (the real worker on CPU torch,
    through a wrapper that arranges the fault the file names). An Xid that needs a GPU reset but
    that the operator ignores is counted on the way: it must not page."""
    torch_python = write_exe(tmp_path / "torch-python",
                             f'#!/bin/sh\nGPU_VERIFY_FAULT=$(cat {fault}) exec {FAULT_PYTHON} "$@"\n')
    write_stub(tmp_path / "bin", "ok", gpus=1)
    return watch_env(fake_nvml, tmp_path, "gpus 1\nevent 0 xid 48 300\n", ENABLE_GPU_CHECK="true",
                     ENABLE_TORCH_CHECK="true", HEALTHCHECK_TORCH_DEVICE="cpu",
                     HEALTHCHECK_TORCH_PYTHON=str(torch_python), HEALTHCHECK_TORCH_TTL="0",
                     HEALTHCHECK_XID_IGNORE="48", GPU_VERIFY_TORCH_PYTHON=sys.executable, GPU_VERIFY_SIMULATE="1",
                     PATH=f"{tmp_path / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}")


def write_configs(tmp_path: Path, serve_port: int, am_port: int, hook_port: int) -> tuple[Path, Path]:
    prom = tmp_path / "prometheus.yml"
    prom.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "healthcheck", "static_configs": [
            {"targets": [f"127.0.0.1:{serve_port}"], "labels": TARGET}]}]}))
    am = tmp_path / "alertmanager.yml"
    am.write_text(yaml.safe_dump({
        "route": {"receiver": "hook", "group_by": ["alertname", "instance"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [
            {"url": f"http://127.0.0.1:{hook_port}/alerts", "send_resolved": False}]}]}))
    return prom, am


def exported(prom_port: int, since: float) -> dict[str, set[str]]:
    """metric -> the label names of its series in Prometheus's own storage."""
    names = {sel.name for r in rules() for text in (r["expr"], *promql.template_queries(
        " ".join(r["annotations"].values()))) for sel in promql.read(text).selectors}
    out = {}
    for name in names:
        series = get(prom_port, "/api/v1/series", **{"match[]": name, "start": f"{since:.3f}"})["data"]
        if series:
            out[name] = {label for s in series for label in s if label != "__name__"}
    return out


def test_a_poisoned_cuda_context_pages_through_prometheus_and_alertmanager(tmp_path: Path, fake_nvml: Path):
    prometheus, alertmanager = tool("prometheus"), tool("prometheus-alertmanager")
    started = time.time()
    fault = tmp_path / "fault"
    fault.write_text("none")
    hook = Webhook()
    srv = Server(tmp_path, serve_env(tmp_path, fake_nvml, fault), ["--interval", "startup=1,readiness=1,liveness=1"])
    prom_port, am_port = free_port(), free_port()
    prom_cfg, am_cfg = write_configs(tmp_path, srv.port, am_port, hook.server_address[1])
    daemons = []
    logs = [tmp_path / "prometheus.log", tmp_path / "alertmanager.log", srv.log]
    try:
        daemons.append(Daemon([alertmanager, f"--config.file={am_cfg}", f"--storage.path={tmp_path / 'am-data'}",
                               f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                              logs[1], srv.marker))
        daemons.append(Daemon([prometheus, f"--config.file={prom_cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"], logs[0], srv.marker))
        for port in (am_port, prom_port):
            until(f"127.0.0.1:{port} ready", lambda p=port: get(p, "/-/ready"), 30, logs)

        def query(expr: str) -> list[dict[str, Any]]:
            return get(prom_port, "/api/v1/query", query=expr)["data"]["result"]

        # Every probe passes: nothing fires, nothing is even pending.
        until("Prometheus sees every probe pass", lambda: len(query(
            'healthcheck_probe_status{profile="readiness",status="pass"} == 1')) == 3 and query(
            'healthcheck_healthy{profile="readiness"} == 1 and on (job, instance) healthcheck_nvml_events_total{xid="48"}'), 90, logs)
        time.sleep(4)  # four more scrapes and rule evaluations
        assert get(prom_port, "/api/v1/alerts")["data"]["alerts"] == []
        groups = get(prom_port, "/api/v1/rules")["data"]["groups"]
        assert {r["name"]: r["health"] for g in groups for r in g["rules"]} == {
            r["alert"]: "ok" for r in rules()}
        assert hook.alerts() == []

        # A sticky CUDA error in the torch worker latches; the page arrives through Alertmanager.
        fault.write_text("assert")
        [alert] = until("the page reaches the webhook", lambda: [
            a for a in hook.alerts() if a["labels"]["alertname"] == POISONED], 90, logs)
        rule = next(r for r in rules() if r["alert"] == POISONED)
        assert alert["status"] == "firing"
        assert alert["labels"] == {"alertname": POISONED, "severity": "critical", "actor": "tenant",
                                   "source": "torch-cuda",
                                   "code": "cuda-fatal", "job": "healthcheck",
                                   "instance": f"127.0.0.1:{srv.port}", **TARGET}
        assert alert["annotations"]["runbook_url"] == rule["annotations"]["runbook_url"]
        assert alert["annotations"]["summary"] == "CUDA context poisoned in ml/gpu-dev-0"
        assert "(reason cuda-fatal)" in alert["annotations"]["description"]
        assert {a["labels"]["alertname"] for a in hook.alerts()} == {POISONED}

        # What the rules read is what Prometheus stored from serve, metric by metric and label by label.
        stored = exported(prom_port, started)
        problems = [p for r in rules() for p in promql.problems(r["alert"], r["expr"], stored, label_domains(),
                                                                r["annotations"].values())]
        assert problems == []
    finally:
        for d in reversed(daemons):
            d.stop()
        hook.shutdown()
        hook.server_close()
        assert srv.terminate() == 0
        srv.cleanup()
    assert not marked_pids(srv.marker)
