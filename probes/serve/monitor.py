"""The monitor (docs/serve.md): each profile's run on its schedule, a child under a deadline, so a
wedged GPU only makes that result stale; and the NVML event watcher child (``watch`` below)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from probes import proc
from probes.hardware import xids
from probes.serve import PROFILES, ServeSettings, view
from probes.serve.view import Run, XidEvent
from probes.spec import PROFILE_RULES
from probes.state import State
from probes.untrusted import squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

log = logging.getLogger("healthcheck.serve")
MAX_EVENTS = 50  # the latest NVML events the endpoints are told of
RESTART_PAUSE = 30.0  # before a watcher that failed is started again
STOP_GRACE = 1.0  # seconds between SIGTERM and SIGKILL: the watcher, and at a stop every descendant
COUNTED_ONLY = {"corrected": "", "ignored": " (ignored: HEALTHCHECK_XID_IGNORE)",
                "no-action": " (NVIDIA's Xid catalog: no action)"}


def severity(kind: str, data: int, settings: ServeSettings) -> str:
    """The lists decide before the catalog: what an operator's list left out warns as other."""
    if kind == "xid":
        if data in settings.xid_ignore:
            return "ignored"
        if data in settings.xid_critical:
            return xids.CRITICAL
        if data in settings.xid_application:
            return xids.APPLICATION
        return xids.NO_ACTION if xids.bucket(data).severity == xids.NO_ACTION else xids.OTHER
    return xids.CRITICAL if kind == "ecc-double" else "corrected"


class Monitor:
    def __init__(self, settings: ServeSettings, deadlines: Mapping[str, float], state: State):
        self.settings, self.deadlines, self.state = settings, deadlines, state
        # The slack defaults to the run's deadline: a slow but working run never goes stale.
        slack = {p: deadlines[p] if settings.slack is None else settings.slack for p in PROFILES}
        # What the endpoints read: replaced whole under the lock, never changed in place.
        self.snap = view.Snapshot("starting" if settings.xid_watch else "off", settings.intervals,
                                  {p: settings.intervals[p] + slack[p] for p in PROFILES}, state.latch())
        self.stop, self.lock = threading.Event(), threading.Lock()
        self.xid_latch: dict[str, Any] | None = None  # kept here too: the state dir may not keep it
        self.slowing: set[int] = set()  # GPUs whose slowdown warns (the log says when that changes)
        self.threads = [threading.Thread(target=self._schedule, args=(p,), daemon=True) for p in PROFILES]
        if settings.xid_watch:
            self.threads.append(threading.Thread(target=self._watch, daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def terminate(self) -> None:
        """No further run; TERM, then KILL, to every descendant; a last sweep ends a run begun meanwhile."""
        t0 = time.monotonic()
        with self.lock:
            self.stop.set()
        proc.end_descendants(STOP_GRACE)
        end = max(time.monotonic() + 0.5, t0 + 3.0)
        for thread in self.threads:
            thread.join(max(0.0, end - time.monotonic()))
        proc.end_descendants(0.2)

    def _schedule(self, profile: str) -> None:
        while not self.stop.is_set():
            if PROFILE_RULES[profile].once and self.snap.startup_passed is not None:
                return  # like Kubernetes: once startup passed it is not checked again
            try:
                run = self.run_once(profile)
            except Exception:  # a bug here must not end the schedule silently
                log.exception("monitor: %s run failed internally", profile)
                run = Run(profile, time.time(), time.monotonic(), 0.0, None, "internal-error",
                          "the monitor failed internally; see the log")
            if self.stop.is_set():
                return
            self.record(run)
            self.stop.wait(self.settings.intervals[profile])

    def run_once(self, profile: str) -> Run:
        # A server started isolated (-I, as the front door does) keeps its runs isolated too.
        python, budget = self.settings.python or sys.executable, self.deadlines[profile]
        argv = [python, *(["-I"] if sys.flags.isolated and python == sys.executable else []),
                "-m", "probes", "--json", "--profile", profile]
        if not self.settings.deep and PROFILE_RULES[profile].spawns_worker:
            argv += ["--skip", "torch-cuda"]
        t0 = time.monotonic()
        done = proc.run(argv, deadline=t0 + budget)
        finished, mono = time.time(), time.monotonic()
        report = view.parse_report(done.stdout)
        failed = [(reason, said) for bad, reason, said in [  # the first that holds: a reason of RUN_FAILED
            (done.spawn_error, "spawn-error", f"cannot start {argv[0]} ({done.spawn_error})"),
            (done.timed_out or done.stuck, "deadline", f"no report within {budget:g} s; the run was stopped"),
            (done.returncode == 3, "config-error", "the check exited 3 (configuration error); see the log"),
            (done.signal, "crashed", f"the check was killed by signal {done.signal}"),
            (done.returncode not in (0, 1), "bad-exit",
             f"the check exited {done.returncode} without a report"),
            (report is None, "bad-output", "the check printed no valid health+json report")] if bad]
        if not failed:
            return Run(profile, finished, mono, mono - t0, report)
        log.warning("monitor: %s run: %s (exit %s, stdout %r, stderr %r)", profile, failed[0][1],
                    done.returncode, squeeze(done.stdout, 400), squeeze(done.stderr, 400))
        return Run(profile, finished, mono, mono - t0, None, *failed[0])

    def record(self, run: Run) -> None:
        status = run.report["status"] if run.report is not None else "fail"
        key = (run.profile, run.reason or status)  # an outcome: a status, or why there is no report
        checks = (run.report or {}).get("checks", {})
        passed = {(run.profile, view.check_name(k)): run.finished for k, es in checks.items()
                  if es and es[0]["status"] != "fail"}
        once = PROFILE_RULES[run.profile].once and status != "fail"
        latch = self.state.latch()
        with self.lock:
            s = self.snap
            self.snap = s._replace(runs={**s.runs, run.profile: run}, latch=self.xid_latch or latch,
                                   startup_passed=run if once else s.startup_passed,
                                   runs_total={**s.runs_total, key: s.runs_total.get(key, 0) + 1},
                                   last_success={**s.last_success, **passed})
        log.info("monitor: %s %s in %.2f s%s", run.profile, status, run.duration,
                 f" ({run.reason})" if run.reason else "")

    def add_event(self, event: XidEvent) -> None:
        said = event.describe() + (f": {event.advice()}" if event.kind == "xid" else "")
        code = f"xid-{event.data}" if event.kind == "xid" else event.kind
        key = (str(event.gpu), event.kind, str(event.data) if event.kind == "xid" else "", event.severity)
        with self.lock:
            latch_now = event.severity == xids.CRITICAL and self.xid_latch is None
            if latch_now:
                self.xid_latch = {"source": "xid", "code": code, "reason": said, "time": event.time}
            s = self.snap
            counts = {**s.event_counts, key: s.event_counts.get(key, 0) + 1}
            self.snap = s._replace(events=(*s.events[1 - MAX_EVENTS:], event), event_counts=counts,
                                   latch=self.xid_latch or s.latch)
        if event.severity in COUNTED_ONLY:
            log.info("NVML event: %s%s", said, COUNTED_ONLY[event.severity])
        elif event.severity != xids.CRITICAL:
            log.warning("NVML event: %s", said)
        else:
            log.error("NVML event: %s; latched unhealthy until the container restarts", said)
            if latch_now and not self.state.set_latch("xid", said, code):
                log.error("latch kept by this serve process only, the state dir could not keep it (%s): exec "
                          "probes will not see it, and a restart of serve forgets it", self.state.problem)

    def _slowdown_reading(self, gpu: int) -> None:
        now = time.time()
        with self.lock:
            s = self.snap
            recent = (t for t in (*s.slowdown.get(gpu, ()), now) if now - t < view.SLOWDOWN_WINDOW)
            times = tuple(recent)[-4096:]
            self.snap = s._replace(slowdown={**s.slowdown, gpu: times})
        verdict = view.slowdown_window(times, now)
        if verdict.warn != (gpu in self.slowing):  # said when it starts and when it ends
            self.slowing ^= {gpu}
            if verdict.warn:
                log.warning("%s: check the power supply and cooling", verdict.describe(gpu))
            else:
                log.info("GPU %d: hardware slowdown below %g/min again", gpu, view.SLOWDOWN_PER_MINUTE)

    def _set_watcher(self, state: str) -> None:
        with self.lock:
            self.snap = self.snap._replace(watcher=state)

    def _watch(self) -> None:
        argv = [sys.executable, *(["-I"] if sys.flags.isolated else []), "-m", "probes.serve.monitor",
                f"{self.settings.slowdown_sample:g}"]
        while True:
            with self.lock:
                if self.stop.is_set():
                    return
                try:
                    child = proc.spawn(argv, stderr=None)  # its stderr: serve's
                except OSError as exc:
                    child, outcome = None, f"cannot start {argv[0]}: {os.strerror(exc.errno or 0)}"
            if child is not None:  # proc.end: it, and what it left behind if it ended by itself
                outcome = f"{self._read(child)}, exit {proc.end(child, grace=STOP_GRACE)}"
            if self.stop.is_set():
                return
            if outcome.startswith("unavailable"):
                self._set_watcher("unavailable")
                return  # said once; the server keeps serving without events
            self._set_watcher("failed")
            log.warning("NVML event watcher ended (%s); restarting in %g s; events until then are not seen",
                        outcome, RESTART_PAUSE)
            if self.stop.wait(RESTART_PAUSE):
                return
            self._set_watcher("starting")  # "running" once the child has registered for events

    def _read(self, child: subprocess.Popen[bytes]) -> str:
        """The watcher's lines (``watch`` below) until it closes its output; why it ended."""
        assert child.stdout is not None
        outcome = "ended"
        for raw in child.stdout:
            try:
                what, *args = json.loads(raw)
            except (ValueError, TypeError):
                continue  # not a line of ours (something else printed on its stdout)
            if what == "started":
                self._set_watcher("running")
            elif what == "unavailable":
                outcome = "unavailable"
                log.warning("NVML events unavailable (%s): %s; Xid/ECC events are not watched, serving goes "
                            "on", squeeze(args[0], 40), squeeze(args[1], 300))
            elif what == "event" and args[2] == "slowdown":
                self._slowdown_reading(args[0])
            elif what == "event":
                gpu, uuid, kind, data = args
                self.add_event(XidEvent(time.time(), gpu if gpu >= 0 else None, squeeze(uuid, 80), kind, data,
                                        severity(kind, data, self.settings)))
        child.stdout.close()
        return outcome


def watch(sample_s: float) -> None:
    """The watcher child (its own process, as an NVML call can hang): a JSON line ``["started"]``,
    then ``["event", gpu, uuid, kind, data]`` for each event, or ``["unavailable", reason, message]``;
    any other failure is a traceback on stderr and exit status 1."""
    from probes.hardware import nvml_lib

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        events = nvml_lib.watch_events(stop, 500, sample_s)
        print('["started"]', flush=True)
        for ev in events:
            print(json.dumps(["event", ev.gpu_index, ev.uuid, ev.kind, ev.data]), flush=True)
    except nvml_lib.NvmlUnavailable as exc:
        print(json.dumps(["unavailable", exc.reason, exc.message]), flush=True)


if __name__ == "__main__":
    watch(float(sys.argv[1]))
