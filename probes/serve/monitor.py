"""The monitor (docs/serve.md): each profile's run on its schedule, a child under a deadline, so a
wedged GPU only makes that result stale; and the NVML event watcher child (``watch`` below)."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

from probes import proc
from probes.hardware import xids
from probes.serve import PROFILES, ServeSettings, view
from probes.serve.view import Run, XidEvent
from probes.spec import PROFILE_RULES
from probes.untrusted import squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping
    from typing import IO, Any

    from probes.state import State

log = logging.getLogger("healthcheck.serve")
MAX_EVENTS = 50  # the latest NVML events the endpoints are told of
RESTART_PAUSE = 30.0  # before a watcher that failed is started again
STOP_GRACE = 1.0  # seconds between SIGTERM and SIGKILL: the watcher, and at a stop every descendant
KINDS = ("xid", "ecc-single", "ecc-double")
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
    def __init__(self, settings: ServeSettings, deadlines: Mapping[str, float], state: State, *,
                 stderr: IO[Any] | None = None):
        self.settings, self.deadlines, self.state, self.stderr = settings, deadlines, state, stderr
        # By default a result goes stale only when a run overran its deadline: a slow but working
        # run never turns readiness off by itself.
        slack = {p: deadlines[p] if settings.slack is None else settings.slack for p in PROFILES}
        # What the endpoints read: replaced whole under the lock, never changed in place.
        watcher = "starting" if settings.xid_watch else "off"
        self.snap = view.Snapshot({}, None, None, (), watcher, settings.intervals,
                                  {p: settings.intervals[p] + slack[p] for p in PROFILES}, {}, {}, {}, {})
        self.env, self.stop, self.lock = dict(os.environ), threading.Event(), threading.Lock()
        self.xid_latch: dict[str, Any] | None = None  # kept here too: the state dir may not keep it
        self.slowing: set[int] = set()  # GPUs whose slowdown warns (the log says when that changes)
        self.threads: list[threading.Thread] = []
        self.child: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.snap = self.snap._replace(latch=self.state.latch())
        self.threads = [threading.Thread(target=self._schedule, args=(p,), daemon=True) for p in PROFILES]
        if self.settings.xid_watch:
            self.threads.append(threading.Thread(target=self._watch, daemon=True))
        for t in self.threads:
            t.start()

    def terminate(self) -> None:
        """No further run; the watcher ends now (the caller's sweep ends the runs in flight)."""
        with self.lock:
            self.stop.set()
        if self.child is not None:
            proc.end(self.child, grace=STOP_GRACE)

    def _schedule(self, profile: str) -> None:
        while not self.stop.is_set():
            if PROFILE_RULES[profile].once and self.snap.startup_passed is not None:
                return  # like Kubernetes: once startup passed it is not checked again
            try:
                run = self.run_once(profile)
            except Exception:  # a bug here must not end the schedule silently
                log.exception("monitor: %s run failed internally", profile)
                run = Run(profile, time.time(), time.time(), time.monotonic(), None, "internal-error",
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
        started, t0 = time.time(), time.monotonic()
        done = proc.run(argv, deadline=t0 + budget, env=self.env)
        finished, mono = time.time(), time.monotonic()

        def broken(reason: str, message: str) -> Run:  # a reason of probes.serve.RUN_FAILED
            log.warning("monitor: %s run: %s (exit %s, stdout %r, stderr %r)", profile, message,
                        done.returncode, squeeze(done.stdout, 400), squeeze(done.stderr, 400))
            return Run(profile, started, finished, mono, None, reason, message)

        if done.spawn_error:
            return broken("spawn-error", f"cannot start {argv[0]} ({done.spawn_error})")
        if done.timed_out or done.stuck:
            return broken("deadline", f"no report within {budget:g} s; the run was stopped")
        if done.returncode == 3:
            return broken("config-error", "the check exited 3 (configuration error); see the log")
        if done.returncode not in (0, 1) and done.signal:
            return broken("crashed", f"the check was killed by signal {done.signal}")
        if done.returncode not in (0, 1):
            return broken("bad-exit", f"the check exited {done.returncode} without a report")
        report = view.parse_report(done.stdout)
        if report is None:
            return broken("bad-output", "the check printed no valid health+json report")
        return Run(profile, started, finished, mono, report)

    def record(self, run: Run) -> None:
        key = (run.profile, run.status if run.report is not None else run.reason or "error")
        checks = (run.report or {}).get("checks", {})
        passed = {(run.profile, view.check_name(k)): run.finished for k, es in checks.items()
                  if es and es[0]["status"] != "fail"}
        once = PROFILE_RULES[run.profile].once and run.report is not None and run.status != "fail"
        latch = self.state.latch()
        with self.lock:
            s = self.snap
            self.snap = s._replace(runs={**s.runs, run.profile: run}, latch=self.xid_latch or latch,
                                   startup_passed=run if once else s.startup_passed,
                                   runs_total={**s.runs_total, key: s.runs_total.get(key, 0) + 1},
                                   last_success={**s.last_success, **passed})
        log.info("monitor: %s %s in %.2f s%s", run.profile, run.status, run.duration,
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

    def _slowdown_reading(self, gpu: int, when: float) -> None:
        now = time.time()
        with self.lock:
            s = self.snap
            recent = (t for t in (*s.slowdown.get(gpu, ()), when) if now - t < view.SLOWDOWN_WINDOW)
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
                    self.child = proc.spawn(argv, env=self.env, stderr=self.stderr)
                except OSError as exc:
                    self.child, outcome = None, f"cannot start {argv[0]}: {os.strerror(exc.errno or 0)}"
            if self.child is not None:  # proc.end: it, and what it left behind if it ended by itself
                outcome = self._read(self.child)
                outcome += f", exit {proc.end(self.child, grace=STOP_GRACE)}"
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
        """The watcher's lines until it closes its output; why it ended."""
        assert child.stdout is not None
        outcome = "ended"
        for raw in child.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            if not isinstance(obj, dict):
                log.warning("NVML event watcher printed a line that is not a JSON object; ignored")
                continue
            kind, what, data, gpu, t = (obj.get(k) for k in ("type", "kind", "data", "gpu", "time"))
            gpu = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0 else None
            when = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else time.time()
            if kind == "started":
                self._set_watcher("running")
            elif kind == "event" and what == "slowdown" and gpu is not None:
                self._slowdown_reading(gpu, when)
            elif kind == "event" and what in KINDS and isinstance(data, int) and not isinstance(data, bool):
                self.add_event(XidEvent(when, gpu, squeeze(obj.get("uuid") or "", 80), what, data,
                                        severity(what, data, self.settings)))
            elif kind == "unavailable":
                outcome = "unavailable"
                log.warning("NVML events unavailable (%s): %s; Xid/ECC events are not watched, serving goes "
                            "on", squeeze(obj.get("reason"), 40), squeeze(obj.get("message", ""), 300))
            elif kind == "error":
                outcome = f"error {squeeze(obj.get('reason'), 40)}"
        child.stdout.close()
        return outcome


def watch(sample_s: float) -> int:
    """The watcher child (its own process, as an NVML call can hang): a JSON line ``started``, then
    ``event`` (gpu, uuid, kind, data, time) each, ``unavailable`` (reason, message) or ``error``."""
    import signal

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def emit(**line: Any) -> None:
        sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    from probes.hardware import nvml_lib

    try:
        events = nvml_lib.watch_events(stop, 500, sample_s)
        emit(type="started")
        for ev in events:
            emit(type="event", gpu=ev.gpu_index, uuid=ev.uuid, kind=ev.kind, data=ev.data, time=time.time())
    except nvml_lib.NvmlUnavailable as exc:
        log.warning("NVML events unavailable: %s", exc.message)
        emit(type="unavailable", reason=exc.reason, message=exc.message)
    except BrokenPipeError:
        pass  # serve went away
    except Exception as exc:
        log.exception("NVML event watch failed")
        code = nvml_lib.error_code(exc) if nvml_lib.is_nvml_error(exc) else None
        emit(type="error", reason="internal-error" if code is None else nvml_lib.describe(code).cause.reason)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(watch(float(sys.argv[1])))
