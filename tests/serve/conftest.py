"""Helpers for `healthcheck serve` tests: a real server process on a free loopback port.

Every process a test starts carries a unique marker in its environment, so the test
can prove that nothing is left behind after SIGTERM (children inherit the environment).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from probes import registry
from tests.conftest import ROOT, clean_env

PYTHON = sys.executable
FAKES = ROOT / "tests" / "fakes"
FAKE_NVML_DIR = FAKES / "build"


def marked_pids(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment carries the marker."""
    found = []
    needle = f"HC_SERVE_TEST={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0") and stat[stat.rfind(b")") + 2:][:1] != b"Z":
            found.append(int(entry))
    return found


class Server:
    def __init__(self, tmp: Path, env: dict[str, str], args: list[str]):
        self.tmp = tmp
        self.state = tmp / "state"
        self.state.mkdir(mode=0o700, exist_ok=True)
        self.marker = uuid.uuid4().hex
        self.log = tmp / "serve.log"
        self.env = clean_env(HEALTHCHECK_STATE_DIR=str(self.state), HC_SERVE_TEST=self.marker,
                             PYTHONPATH=str(ROOT))
        self.env.update(env)
        self._log_fh = open(self.log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([PYTHON, "-m", "probes", "serve", "--port", "0", *args], cwd=ROOT,
                                     env=self.env, stdout=subprocess.DEVNULL, stderr=self._log_fh)
        self.port = self._wait_port()

    def _wait_port(self, timeout: float = 20.0) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.log_text()}")
            for line in self.log_text().splitlines():
                if "serving on http://" in line:
                    return int(line.rsplit(":", 1)[1].split()[0])
            time.sleep(0.05)
        raise AssertionError(f"serve did not start: {self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def health(self, path: str) -> tuple[int, dict[str, Any]]:
        code, headers, body = self.get(path)
        assert headers["content-type"] == "application/health+json"
        return code, json.loads(body)

    def wait_for(self, path: str, pred: Any, timeout: float, what: str) -> tuple[int, dict[str, Any]]:
        end = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < end:
            last = self.health(path)
            if pred(*last):
                return last
            time.sleep(0.1)
        raise AssertionError(f"{what}: not within {timeout} s; last answer {last}\nlog:\n{self.log_text()}")

    def wait_runs_ended(self, timeout: float = 20.0) -> dict[str, dict[str, Any]]:
        """Until each profile has the result of its first run; returns the bodies by path."""
        bodies = {}
        for path in ("/livez", "/readyz", "/startupz"):
            _, bodies[path] = self.wait_for(path, lambda c, b: b.get("reason") != "pending", timeout,
                                            f"{path}: a run ends")
        return bodies

    def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log_fh.close()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        for pid in marked_pids(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not self._log_fh.closed:
            self._log_fh.close()


@pytest.fixture
def start_server(tmp_path: Path):
    servers: list[Server] = []

    def start(env: dict[str, str], *args: str) -> Server:
        s = Server(tmp_path, env, list(args))
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.cleanup()


# Every probe off (from the registry: a new probe is off here too), and no NVML event watch.
ALL_OFF = {**{t: "false" for t in registry.TOGGLES}, "HEALTHCHECK_SERVE_XID_WATCH": "false"}


def watch_env(fake_nvml: Path, tmp_path: Path, scenario: str, **extra: str) -> dict[str, str]:
    """serve with every probe off, the NVML event watch on, and the fake NVML playing ``scenario``."""
    path = tmp_path / "scenario"
    path.write_text(scenario)
    return dict(ALL_OFF, HEALTHCHECK_SERVE_XID_WATCH="true", LD_LIBRARY_PATH=str(fake_nvml),
                FAKE_NVML_SCENARIO=str(path), **extra)


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def fake_nvml() -> Path:
    if not (FAKE_NVML_DIR / "libnvidia-ml.so.1").exists():
        r = subprocess.run(["make", "-C", str(FAKES)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot build the fake NVML library (make -C tests/fakes): {r.stderr[-300:]}")
    return FAKE_NVML_DIR
