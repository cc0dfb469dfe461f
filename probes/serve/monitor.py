"""The monitor: runs each profile on its schedule in a child process and keeps the latest result.

A run is ``python -m probes --json --profile P`` under a deadline (probes.proc.run), so a wedged
GPU only makes that profile's result stale and never blocks the HTTP handlers, which read a
Snapshot copied out under a lock.
Nothing outlives a run: serve is the child subreaper, so what a run leaves behind is re-parented
to serve with the run's marker in its environment, and proc.run's sweep at its end ends it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from probes import config as cfg
from probes import proc
from probes.result import Status
from probes.serve import PROFILES, ServeSettings
from probes.serve.view import Run, Snapshot, XidEvent, parse_report, results_of
from probes.spec import PROFILE_RULES
from probes.state import State
from probes.untrusted import squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("healthcheck.serve")
MAX_EVENTS = 200
DEEP_PROBE = "torch-cuda"


class Monitor:
    def __init__(self, settings: ServeSettings, deadlines: dict[str, float], state: State,
                 environ: dict[str, str] | None = None):
        self.settings, self.deadlines, self.state = settings, deadlines, state
        # By default a result goes stale only when a run overran its deadline: a slow but working
        # run never turns readiness off by itself.
        slack = {p: deadlines[p] if settings.slack is None else settings.slack for p in PROFILES}
        self.stale_after = {p: settings.intervals[p] + slack[p] for p in PROFILES}
        self.env = dict(os.environ if environ is None else environ)
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}
        self._startup_passed: Run | None = None
        self._latch_file: dict[str, Any] | None = None
        self._xid_latch: dict[str, Any] | None = None
        self._events: list[XidEvent] = []
        self._watcher = "off"
        self._slowdown: dict[int, tuple[float, ...]] = {}
        # Counters and per-probe bookkeeping for /metrics.
        self.runs_total: dict[tuple[str, str], int] = {}
        self.last_success: dict[tuple[str, str], float] = {}
        self.event_counts: dict[tuple[str, str, str, str], int] = {}
        self._threads: list[threading.Thread] = []

    # -- scheduling ---------------------------------------------------------------
    def start(self) -> None:
        self.refresh_latch()
        for profile in cfg.PROFILES:
            t = threading.Thread(target=self._loop, args=(profile,), name=f"monitor-{profile}", daemon=True)
            t.start()
            self._threads.append(t)

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))

    def _loop(self, profile: str) -> None:
        while not self.stop.is_set():
            if PROFILE_RULES[profile].once and self._startup_passed is not None:
                return  # like Kubernetes: once startup passed it is not checked again
            try:
                run = self.run_once(profile)
            except Exception:  # a bug here must not end the schedule silently
                log.exception("monitor: %s run failed internally", profile)
                now = time.time()
                run = Run(profile, now, now, time.monotonic(), None, "internal-error",
                          "the monitor failed internally; see the log")
            if self.stop.is_set():
                return
            self.record(run)
            self.stop.wait(self.settings.intervals[profile])

    def argv(self, profile: str) -> list[str]:
        # A server started isolated (-I, as the front door does) keeps its runs isolated too.
        python = self.settings.python or sys.executable
        isolated = ["-I"] if sys.flags.isolated and python == sys.executable else []
        argv = [python, *isolated, "-m", "probes", "--json", "--profile", profile]
        if not self.settings.deep and PROFILE_RULES[profile].spawns_worker:
            argv += ["--skip", DEEP_PROBE]
        return argv

    def run_once(self, profile: str) -> Run:
        started, t0 = time.time(), time.monotonic()
        budget = self.deadlines[profile]
        done = proc.run(self.argv(profile), deadline=t0 + budget, env=self.env)
        finished, mono = time.time(), time.monotonic()

        def broken(reason: str, message: str) -> Run:
            log.warning("monitor: %s run: %s (exit %s, stdout %r, stderr %r)", profile, message,
                        done.returncode, squeeze(done.stdout, 400), squeeze(done.stderr, 400))
            return Run(profile, started, finished, mono, None, reason, message)

        if done.spawn_error:
            return broken("spawn-error", f"cannot start {self.argv(profile)[0]} ({done.spawn_error})")
        if done.timed_out or done.stuck:
            return broken("deadline", f"no report within {budget:g} s; the run was stopped")
        if done.returncode == 3:
            return broken("config-error", "the check exited 3 (configuration error); see the log")
        if done.returncode not in (0, 1):
            if done.signal:
                return broken("crashed", f"the check was killed by signal {done.signal}")
            return broken("bad-exit", f"the check exited {done.returncode} without a report")
        report = parse_report(done.stdout)
        if report is None:
            return broken("bad-output", "the check printed no valid health+json report")
        return Run(profile, started, finished, mono, report)

    # -- recording ----------------------------------------------------------------
    def record(self, run: Run) -> None:
        outcome = run.status if run.report is not None else (run.reason or "error")
        with self._lock:
            self._runs[run.profile] = run
            if PROFILE_RULES[run.profile].once and run.report is not None and run.status != "fail":
                self._startup_passed = run
            key = (run.profile, outcome)
            self.runs_total[key] = self.runs_total.get(key, 0) + 1
            if run.report is not None:
                for r in results_of(run.report, run.finished):
                    if r.status in (Status.PASS, Status.WARN):
                        self.last_success[(run.profile, r.name)] = run.finished
        log.info("monitor: %s %s in %.2f s%s", run.profile, run.status, run.duration,
                 f" ({run.reason})" if run.reason else "")
        self.refresh_latch()

    def refresh_latch(self) -> None:
        latch = self.state.latch()
        with self._lock:
            self._latch_file = latch

    def set_slowdown(self, gpu: int, times: tuple[float, ...]) -> None:
        """The watcher's slowdown readings of one GPU (times), judged over a window by the view."""
        with self._lock:
            self._slowdown[gpu] = times

    def set_watcher(self, status: str) -> None:
        with self._lock:
            self._watcher = status

    def add_event(self, event: XidEvent) -> None:
        """An NVML event from the watcher; a critical one latches unhealthy."""
        with self._lock:
            self._events.append(event)
            del self._events[:-MAX_EVENTS]
            key = (str(event.gpu), event.kind, str(event.data) if event.kind == "xid" else "", event.severity)
            self.event_counts[key] = self.event_counts.get(key, 0) + 1
            latch_now = event.severity == "critical" and self._xid_latch is None
            said = event.describe() + (f": {event.advice()}" if event.kind == "xid" else "")
            code = f"xid-{event.data}" if event.kind == "xid" else event.kind
            if latch_now:
                self._xid_latch = {"source": "xid", "code": code, "reason": said, "time": event.time}
        if event.severity == "critical":
            log.error("NVML event: %s; latched unhealthy until the container restarts", said)
            if latch_now and not self.state.set_latch("xid", said, code):
                log.error("latch kept by this serve process only, the state dir could not keep it (%s): "
                          "exec probes will not see it, and a restart of serve forgets it",
                          self.state.problem)
        elif event.severity in ("corrected", "ignored", "no-action"):
            log.info("NVML event: %s%s", said, {"ignored": " (ignored: HEALTHCHECK_XID_IGNORE)",
                                                  "no-action": " (NVIDIA's Xid catalog: no action)"}.get(
                                                      event.severity, ""))
        else:
            log.warning("NVML event: %s", said)

    # -- reading ------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self._lock:
            latch = self._xid_latch or self._latch_file
            return Snapshot(
                runs=dict(self._runs), startup_passed=self._startup_passed, latch=latch,
                events=tuple(self._events[-50:]), watcher=self._watcher,
                intervals=dict(self.settings.intervals),
                stale_after=self.stale_after,
                slowdown=dict(self._slowdown))

    def counters(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], float],
                                dict[tuple[str, str, str, str], int]]:
        with self._lock:
            return dict(self.runs_total), dict(self.last_success), dict(self.event_counts)
