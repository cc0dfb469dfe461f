"""Step 4 of `make gpu-verify`: healthcheck serve with the NVML event watch on, polled on the
loopback for a while: no invented latch, real metrics, a clean SIGTERM.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import time
from typing import Any

from verify_core import FRONT_DOOR, ROOT, Core, expect

LOOPBACK = "127.0.0.1"


def says_latched(body: str) -> bool:
    """Whether a /livez body says latched (its latch:state check fails)."""
    try:
        entries = json.loads(body).get("checks", {}).get("latch:state") or [{}]
    except (ValueError, AttributeError):
        return False
    return entries[0].get("status") == "fail"


class ServeChecks(Core):
    """Step 4: the serve session, then one judgement per check."""

    def step4(self) -> None:
        self.begin(4)
        seen: dict[str, Any] = {}
        self.check("serve starts on a free port with HEALTHCHECK_SERVE_XID_WATCH=true",
                   lambda: self.serve_session(seen))
        self.check("/livez answers 200 throughout: no Xid latch invented", lambda: self.judge_livez(seen))
        self.check("/metrics: healthcheck_latched 0, nvml pass, event watch running",
                   lambda: self.judge_metrics(seen))
        self.check("/readyz and /startupz answer 200", lambda: self.judge_ready(seen))
        self.check("SIGTERM: exit 0, nothing left behind", lambda: self.judge_stop(seen))

    @staticmethod
    def get(port: int, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def serve_session(self, seen: dict[str, Any]) -> str:
        seconds = 10 if self.fake else 20
        env = self.with_env(HEALTHCHECK_STATE_DIR=self.new_state(), HEALTHCHECK_SERVE_XID_WATCH="true",
                            HEALTHCHECK_SERVE_INTERVAL="startup=5,readiness=5,liveness=3", HEALTHCHECK_LOG_FILE=None)
        log_path = self.logs / "serve.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([FRONT_DOOR, "serve", "--port", "0"], cwd=ROOT, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        seen["proc"] = proc
        try:
            port = 0
            end = time.monotonic() + 30
            while not port and time.monotonic() < end and proc.poll() is None:
                found = re.search(r"serving on [a-z]+://[^\s:]+:(\d+)", log_path.read_text(errors="replace"))
                port = int(found[1]) if found else 0
                time.sleep(0.1)
            expect(port, f"serve did not say where it listens (exit {proc.poll()}); see logs/serve.log")
            seen["port"] = port
            polls: list[tuple[float, int, str]] = []
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                code, body = self.get(port, "/livez")
                polls.append((round(time.monotonic() - start, 1), code, body))
                time.sleep(1.0)
            seen["livez"] = polls
            ready = self.get(port, "/readyz")
            end = time.monotonic() + 60  # the first readiness run includes the torch op
            while ready[0] != 200 and '"reason":"pending"' in ready[1].replace(" ", "") and time.monotonic() < end:
                time.sleep(1.0)
                ready = self.get(port, "/readyz")
            seen["readyz"], seen["startupz"] = ready, self.get(port, "/startupz")
            seen["metrics"] = self.get(port, "/metrics")[1]
            self.log("serve-answers", f"/readyz {ready}\n/startupz {seen['startupz']}\n/metrics\n{seen['metrics']}\n"
                     f"/livez polls\n" + "\n".join(f"{t} {c} {b}" for t, c, b in polls))
        finally:
            seen["stop"] = self.stop_serve(proc)
        return f"listened on {LOOPBACK}:{port}; watched for {seconds} s"

    def stop_serve(self, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        start = time.monotonic()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc: int | None = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = None
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stopped = time.monotonic() - start
        left, _ = self.wait_gone(5)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return {"rc": rc, "seconds": stopped, "left": left}

    def judge_livez(self, seen: dict[str, Any]) -> str:
        polls = seen.get("livez")
        expect(polls, "serve did not run (see the check above)")
        first = next((i for i, (_, code, _) in enumerate(polls) if code == 200), None)
        expect(first is not None, f"/livez never answered 200: last {polls[-1][1]} {polls[-1][2][:200]}")
        bad = [(t, code, body) for t, code, body in polls[first:] if code != 200 or says_latched(body)]
        expect(not bad, f"/livez answered {bad[0][1]} at {bad[0][0]} s: {bad[0][2][:200]}" if bad else "")
        return f"{len(polls) - first} polls answered 200 (first after {polls[first][0]} s), no latch"

    @staticmethod
    def samples(text: str, metric: str) -> list[tuple[dict[str, str], float]]:
        out = []
        for line in text.splitlines():
            found = re.match(rf"^{metric}(?:\{{(.*)\}})?\s+(\S+)", line)
            if found:
                labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', found[1] or ""))
                out.append((labels, float(found[2])))
        return out

    def judge_metrics(self, seen: dict[str, Any]) -> str:
        text = seen.get("metrics")
        expect(text, "no /metrics answer (see the checks above)")
        latched = self.samples(text, "healthcheck_latched")
        expect(latched and all(v == 0 for _, v in latched), f"healthcheck_latched: {latched}")
        nvml = [lab["profile"] for lab, v in self.samples(text, "healthcheck_probe_status")
                if lab.get("probe") == "nvml" and lab.get("status") == "pass" and v == 1]
        expect(nvml, "no healthcheck_probe_status{probe=\"nvml\",status=\"pass\"} 1")
        watch = [lab.get("state") for lab, v in self.samples(text, "healthcheck_nvml_event_watch") if v == 1]
        expect(watch == ["running"], f"healthcheck_nvml_event_watch is {watch}, not running")
        events = [(lab, v) for lab, v in self.samples(text, "healthcheck_nvml_events_total") if v > 0]
        expect(not [e for e in events if e[0].get("severity") == "critical"], f"critical NVML events: {events}")
        noted = f"; {len(events)} non-critical event series" if events else "; no NVML event"
        return f"healthcheck_latched 0, nvml pass in {', '.join(nvml)}, event watch running{noted}"

    def judge_ready(self, seen: dict[str, Any]) -> str:
        ready, startup = seen.get("readyz"), seen.get("startupz")
        expect(ready and startup, "no answer (see the checks above)")
        expect(ready[0] == 200, f"/readyz {ready[0]}: {ready[1][:300]}")
        expect(startup[0] == 200, f"/startupz {startup[0]}: {startup[1][:300]}")
        return "200 and 200"

    def judge_stop(self, seen: dict[str, Any]) -> str:
        stop = seen.get("stop")
        expect(stop, "serve did not run")
        expect(stop["rc"] == 0, f"serve exited {stop['rc']} after SIGTERM ({stop['seconds']:.1f} s)")
        expect(not stop["left"], f"left behind: {stop['left']}")
        return f"exit 0 in {stop['seconds']:.2f} s, nothing left behind"
