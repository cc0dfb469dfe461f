"""Runs the NVML event watcher child (probes.serve.xid_watch) and feeds its events to the monitor.

The child is long-lived and streams its output: started with proc.spawn (its own session and run
marker), read line by line in a thread, ended with everything it started by proc.end. NVML
unavailable: the child says so once and exits, and serve keeps serving. A child that fails while
watching is started again after a pause (events in between are lost; the log says so).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque

from probes import proc
from probes.hardware import xids
from probes.serve import ServeSettings
from probes.serve.monitor import Monitor
from probes.serve.view import (
    SLOWDOWN_PER_MINUTE,
    SLOWDOWN_WINDOW,
    XidEvent,
    slowdown_window,
)
from probes.untrusted import squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

log = logging.getLogger("healthcheck.serve")
RESTART_PAUSE = 30.0
STOP_GRACE = 1.0  # seconds between SIGTERM and SIGKILL for the watcher
WAIT_MS = 500
KINDS = ("xid", "ecc-single", "ecc-double")


def severity(kind: str, data: int, settings: ServeSettings) -> str:
    """critical (latches), application or other (warn), corrected, ignored or no-action (counted only).

    Xids: HEALTHCHECK_XID_IGNORE first, then the critical and application lists (by default
    from NVIDIA's catalog, probes.hardware.xids), then the catalog for the rest: its IGNORE is
    no-action, anything else (an Xid an operator's list left out included) warns as other."""
    if kind == "xid":
        if data in settings.xid_ignore:
            return "ignored"
        if data in settings.xid_critical:
            return "critical"
        if data in settings.xid_application:
            return "application"
        return xids.NO_ACTION if xids.bucket(data).severity == xids.NO_ACTION else xids.OTHER
    if kind == "ecc-double":
        return "critical"  # uncorrectable memory error: the GPU needs a reset or row remap
    return "corrected"


def parse_event(obj: dict[str, Any], settings: ServeSettings) -> XidEvent | None:
    kind, data, gpu = obj.get("kind"), obj.get("data"), obj.get("gpu")
    if kind not in KINDS or not isinstance(data, int) or isinstance(data, bool):
        return None
    gpu_index = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0 else None
    t = obj.get("time")
    return XidEvent(time=float(t) if isinstance(t, (int, float)) else time.time(), gpu=gpu_index,
                    uuid=squeeze(obj.get("uuid") or "", 80), kind=kind, data=data,
                    severity=severity(kind, data, settings))


class Watcher:
    def __init__(self, settings: ServeSettings, monitor: Monitor, *, stderr: IO[Any] | None = None,
                 environ: dict[str, str] | None = None):
        self.settings = settings
        self.monitor = monitor
        self.stderr = stderr
        self.env = dict(os.environ if environ is None else environ)
        self.stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._slowdowns: dict[int, deque[float]] = {}
        self._slowing: set[int] = set()

    def start(self) -> None:
        if not self.settings.xid_watch:
            self.monitor.set_watcher("off")
            return
        self.monitor.set_watcher("starting")
        self._thread = threading.Thread(target=self._loop, name="xid-watcher", daemon=True)
        self._thread.start()

    def _spawn(self) -> subprocess.Popen[bytes] | None:
        isolated = ["-I"] if sys.flags.isolated else []
        argv = [sys.executable, *isolated, "-m", "probes.serve.xid_watch", "--wait-ms", str(WAIT_MS),
                "--sample-s", f"{self.settings.slowdown_sample:g}"]
        with self._lock:
            if self.stop.is_set():
                return None
            try:
                self._proc = proc.spawn(argv, env=self.env, stderr=self.stderr)
            except OSError as exc:
                log.error("cannot start the NVML event watcher %s: %s", argv[0], os.strerror(exc.errno or 0))
                return None
            return self._proc

    def _loop(self) -> None:
        failures = 0
        while not self.stop.is_set():
            p = self._spawn()
            if p is None:
                if self.stop.is_set():
                    return
                self.monitor.set_watcher("failed")
                self.stop.wait(RESTART_PAUSE)
                continue
            self.monitor.set_watcher("starting")  # "running" once the child has registered
            outcome = self._read(p)
            try:
                p.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            proc.end(p, grace=STOP_GRACE)  # also what it left behind if it exited by itself
            if self.stop.is_set():
                return
            if outcome == "unavailable":
                self.monitor.set_watcher("unavailable")
                return  # said once; the server keeps serving without events
            failures += 1
            self.monitor.set_watcher("failed")
            log.warning("NVML event watcher ended (%s, exit %s); restarting in %g s; events until then are "
                        "not seen", outcome, p.returncode, RESTART_PAUSE)
            self.stop.wait(RESTART_PAUSE)

    def _read(self, p: subprocess.Popen[bytes]) -> str:
        assert p.stdout is not None
        outcome = "ended"
        for raw in p.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                log.warning("NVML event watcher printed a line that is not JSON; ignored")
                continue
            if not isinstance(obj, dict):
                continue
            kind = obj.get("type")
            if kind == "started":
                self.monitor.set_watcher("running")
            elif kind == "event" and obj.get("kind") == "slowdown":
                self._slowdown(obj)
            elif kind == "event":
                ev = parse_event(obj, self.settings)
                if ev is not None:
                    self.monitor.add_event(ev)
            elif kind == "unavailable":
                outcome = "unavailable"
                log.warning("NVML events unavailable (%s): %s; Xid/ECC events are not watched, "
                            "serving goes on", squeeze(obj.get("reason"), 40),
                            squeeze(obj.get("message", ""), 300))
            elif kind == "error":
                outcome = f"error {squeeze(obj.get('reason'), 40)}"
        p.stdout.close()
        return outcome

    def _slowdown(self, obj: dict[str, Any]) -> None:
        gpu = obj.get("gpu")
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            return
        now = time.time()
        t = obj.get("time")
        times = self._slowdowns.setdefault(gpu, deque(maxlen=4096))
        times.append(float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else now)
        while times and times[0] <= now - SLOWDOWN_WINDOW:
            times.popleft()
        verdict = slowdown_window(times, now)
        self.monitor.set_slowdown(gpu, tuple(times))
        if verdict.warn and gpu not in self._slowing:
            self._slowing.add(gpu)
            log.warning("%s: check the power supply and cooling", verdict.describe(gpu))
        elif not verdict.warn and gpu in self._slowing:
            self._slowing.discard(gpu)
            log.info("GPU %d: hardware slowdown below %g/min again", gpu, SLOWDOWN_PER_MINUTE)

    def terminate(self) -> None:
        with self._lock:
            self.stop.set()
            p = self._proc
        if p is not None:
            proc.end(p, grace=STOP_GRACE)  # it, and anything of its run still there
        if self._thread is not None:
            self._thread.join(1.0)
