"""`healthcheck serve` as a whole process: real sockets, real monitor runs, real signals."""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT, clean_env
from tests.descendants import KINDS, hang, stub
from tests.serve.conftest import ALL_OFF, PYTHON, marked_pids, write_exe
from tests.servers import leftovers, wait_gone


def _p99(samples: list[float]) -> float:
    s = sorted(samples)
    return s[max(0, int(len(s) * 0.99) - 1)]


def test_endpoints_answer_health_json_and_metrics(start_server):
    srv = start_server(ALL_OFF, "--interval", "0.5")
    for path in ("/livez", "/readyz", "/startupz"):
        code, body = srv.wait_for(path, lambda c, b: c == 200, 20, f"{path} 200")
        assert body["status"] == "pass"
        assert body["profile"] in ("liveness", "readiness", "startup")
        assert set(body) >= {"status", "version", "description", "output", "time", "notes", "checks"}
        age = body["checks"]["serve:result-age"][0]
        assert age["observedUnit"] == "s" and age["status"] == "pass"
    code, headers, text = srv.get("/metrics")
    assert code == 200 and headers["content-type"].startswith("text/plain")
    metrics = text.decode()
    for name in ("healthcheck_healthy{profile=\"readiness\"} 1.0", "healthcheck_result_age_seconds",
                 "healthcheck_result_stale", "healthcheck_runs_total", "healthcheck_latched",
                 "healthcheck_nvml_event_watch{state=\"off\"} 1.0"):
        assert name in metrics, name
    assert "python_info" not in metrics  # our own registry, not the global default one
    code, headers, body = srv.get("/nope")
    assert code == 404 and json.loads(body)["reason"] == "not-found"
    assert "Python" not in headers.get("server", "")
    assert srv.terminate() == 0
    assert not marked_pids(srv.marker)


def test_an_exec_check_beside_serve_runs_its_own_probes(start_server, tmp_path: Path):
    """The exec check reads none of serve's files: beside a running serve with the same settings it
    runs its probes itself (a drop-in that says who ran it)."""
    import subprocess

    checks = tmp_path / "checks"
    checks.mkdir(mode=0o755)
    write_exe(checks / "who", "#!/bin/sh\n# healthcheck: profiles=startup,readiness,liveness\n"
              'echo "ran for ${WHO:-serve}"\n')
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_CHECKS_DIR=str(checks)), "--interval", "0.5")
    srv.wait_for("/readyz", lambda c, b: "who:status" in b["checks"], 20, "serve's readiness run")
    env = {k: v for k, v in srv.env.items() if k != "HC_SERVE_TEST"}
    done = subprocess.run([PYTHON, "-m", "probes", "--json"], cwd=ROOT, env={**env, "WHO": "the check"},
                          capture_output=True, text=True, timeout=60, check=False)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["checks"]["who:status"][0]["message"] == "ran for the check", report
    assert not any("healthcheck serve" in n for n in report["notes"]), report["notes"]
    assert not (srv.state / "serve.json").exists()
    assert srv.terminate() == 0


def test_wedged_torch_worker_blocks_nothing_and_readiness_goes_stale(start_server, tmp_path: Path):
    # The first two worker runs (startup's and readiness's first, which may share one) are
    # real torch on the CPU, so readiness passes once; every later one hangs like a wedged GPU.
    hang = write_exe(tmp_path / "torch-python", f"""#!/bin/sh
if mkdir {tmp_path}/real1 2>/dev/null || mkdir {tmp_path}/real2 2>/dev/null; then exec {PYTHON} "$@"; fi
exec sleep 600
""")
    env = dict(ALL_OFF, ENABLE_TORCH_CHECK="true", HEALTHCHECK_TORCH_DEVICE="cpu",
               HEALTHCHECK_TORCH_PYTHON=str(hang), HEALTHCHECK_TORCH_TTL="0", HEALTHCHECK_TIMEOUT="60",
               HEALTHCHECK_SERVE_SLACK="1")
    srv = start_server(env, "--interval", "startup=3600,readiness=0.5,liveness=0.5")
    srv.wait_for("/readyz", lambda c, b: c == 200, 90, "first readiness run passes")
    _, body = srv.wait_for("/readyz", lambda c, b: c == 503, 30, "readiness turns 503")
    assert body["reason"] == "stale", body
    assert body["status"] == "fail"
    assert "stale" in body["output"]

    # While a worker hangs, /livez and /metrics answer from memory.
    timings: dict[str, list[float]] = {"/livez": [], "/metrics": []}
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    for i in range(200):
        path = "/livez" if i % 2 == 0 else "/metrics"
        t0 = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        timings[path].append(time.perf_counter() - t0)
        assert resp.status == 200, path
    conn.close()
    for path, samples in timings.items():
        assert _p99(samples) < 0.100, f"{path} p99 {_p99(samples) * 1000:.1f} ms"
    _, _, text = srv.get("/metrics")
    assert 'healthcheck_result_stale{profile="readiness"} 1.0' in text.decode()

    # SIGTERM while the wedged worker is in flight: exit 0, nothing left behind.
    t0 = time.monotonic()
    assert srv.terminate() == 0
    assert time.monotonic() - t0 < 8
    assert not marked_pids(srv.marker)


def _stub_python(tmp_path: Path, stdout: str, rc: int = 1) -> Path:
    out = tmp_path / "stub-output"
    out.write_text(stdout)
    return write_exe(tmp_path / "stub-python", f"""#!/bin/sh
cat {out}
echo 'Traceback (most recent call last): ValueError: secret-token-123' >&2
exit {rc}
""")


@pytest.mark.parametrize("output", [
    "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: secret-token-123\n",
    '{"status": "pass", "checks": "Traceback secret-token-123"}',
    '{"status": "maybe", "checks": {}}',
])
def test_broken_probe_output_never_reaches_the_client(start_server, tmp_path: Path, output: str):
    stub = _stub_python(tmp_path, output)
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(stub)), "--interval", "0.5")
    for path in ("/livez", "/readyz", "/startupz"):
        code, _, raw = srv.get(path)
        while code == 503 and json.loads(raw)["reason"] == "pending":
            time.sleep(0.1)
            code, _, raw = srv.get(path)
        assert code == 503
        body = json.loads(raw)
        assert body["reason"] == "bad-output"
        assert b"Traceback" not in raw and b"secret-token" not in raw and b"ValueError" not in raw
    _, _, metrics = srv.get("/metrics")
    assert b'outcome="bad-output"' in metrics and b"secret-token" not in metrics
    assert srv.terminate() == 0
    assert "bad-output" not in srv.log_text() or "printed no valid" in srv.log_text()


def test_probe_crash_and_config_error_are_reason_codes(start_server, tmp_path: Path):
    stub = write_exe(tmp_path / "stub-python", "#!/bin/sh\nkill -SEGV $$\n")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(stub)), "--interval", "0.5")
    code, body = srv.wait_for("/readyz", lambda c, b: b["reason"] != "pending", 20, "a run ends")
    assert code == 503 and body["reason"] == "crashed"
    assert srv.terminate() == 0


def test_readiness_gating_off_answers_200_with_an_honest_body(start_server, tmp_path: Path):
    stub = write_exe(tmp_path / "stub-python", "#!/bin/sh\necho garbage\nexit 1\n")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(stub),
                            HEALTHCHECK_SERVE_READINESS_GATING="false"), "--interval", "0.5")
    code, body = srv.wait_for("/readyz", lambda c, b: b["reason"] == "bad-output", 20, "a run ends")
    assert code == 200 and body["status"] == "fail"
    assert any("gating is off" in n for n in body["notes"])
    code, body = srv.health("/livez")
    assert code == 503  # the switch is for readiness only
    assert srv.terminate() == 0


def test_deep_probe_switch_skips_torch(start_server, tmp_path: Path):
    args_file = tmp_path / "args"
    stub = write_exe(tmp_path / "stub-python", f"""#!/bin/sh
echo "$@" >> {args_file}
echo '{{"status":"pass","checks":{{}}}}'
""")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(stub), HEALTHCHECK_SERVE_DEEP="off"),
                       "--interval", "0.5")
    srv.wait_for("/readyz", lambda c, b: c == 200, 20, "readiness passes")
    srv.wait_for("/livez", lambda c, b: c == 200, 20, "liveness passes")
    lines = args_file.read_text().splitlines()
    assert "-m probes --json --profile readiness --skip torch-cuda" in lines
    assert "-m probes --json --profile liveness" in lines
    assert srv.terminate() == 0


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--port", "99999"], {}, "--port"),
    (["--interval", "readiness=-1"], {}, "--interval"),
    (["--bogus"], {}, "unrecognized"),
    ([], {"HEALTHCHECK_XID_CRITICAL": "79,abc"}, "HEALTHCHECK_XID_CRITICAL"),
    ([], {"HEALTHCHECK_XID_CRITICAL": "13"}, "both"),
    ([], {"HEALTHCHECK_SERVE_READINESS_GATING": "maybe"}, "HEALTHCHECK_SERVE_READINESS_GATING"),
    ([], {"HEALTHCHECK_SERVE_PORT": "http"}, "HEALTHCHECK_SERVE_PORT"),
    ([], {"HEALTHCHECK_TIMEOUT": "-3"}, "HEALTHCHECK_TIMEOUT"),
])
def test_bad_flags_and_settings_exit_3_with_one_line(args, env, needle):
    import subprocess

    r = subprocess.run([PYTHON, "-m", "probes", "serve", *args], cwd=ROOT, env=clean_env(**env),
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 3, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_port_in_use_is_one_line_exit_1(start_server):
    import subprocess

    srv = start_server(ALL_OFF)
    r = subprocess.run([PYTHON, "-m", "probes", "serve", "--port", str(srv.port)], cwd=ROOT,
                       env=clean_env(**ALL_OFF), capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "choose another --port" in r.stderr
    assert srv.terminate() == 0


def test_sigint_also_stops_cleanly(start_server):
    srv = start_server(ALL_OFF)
    srv.wait_for("/livez", lambda c, b: c == 200, 20, "liveness passes")
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(10) == 0
    assert not marked_pids(srv.marker)
    assert os.path.exists(srv.state)


def test_a_sigterm_that_another_thread_takes_still_stops_serve(start_server):
    """The kernel may hand a process's SIGTERM to any of its threads, more so on a busy machine;
    only the main thread runs Python's handlers, so it must not sleep through one (docker stop)."""
    srv = start_server(ALL_OFF, "--interval", "3600")
    others = [int(t) for t in os.listdir(f"/proc/{srv.proc.pid}/task") if int(t) != srv.proc.pid]
    assert others, "serve's HTTP server and monitor run in threads of their own"
    assert ctypes.CDLL(None, use_errno=True).tgkill(srv.proc.pid, others[0], signal.SIGTERM) == 0
    assert srv.proc.wait(10) == 0
    assert "stopping" in srv.log_text()


# ------------------------------------------------------------------ nothing outlives a monitor run

def _leaver(tmp_path: Path, kind: str, then: str) -> tuple[Path, str]:
    """A stand-in for the monitor's python (HEALTHCHECK_SERVE_PYTHON) that leaves ``kind``'s
    descendants behind, then runs ``then``."""
    marker = f"hc-serve-{uuid.uuid4().hex[:12]}"
    rest = {"exit": "exit 0", "hang": hang(marker), "cli": f'exec {PYTHON} "$@"'}[then]
    return stub(tmp_path / "leaver-python", kind, marker, rest), marker


def _gone(marker: str, within: float = 2.0) -> list[str]:
    left = wait_gone(marker, within)
    for p in left:
        p.kill()
    return [" ".join(p.info["cmdline"] or []) for p in left]


@pytest.mark.parametrize("kind", KINDS)
def test_a_monitor_run_that_exits_leaves_nothing(start_server, tmp_path: Path, kind: str):
    """What a run left behind is re-parented to serve (the subreaper) and ended by the run's
    own sweep, while serve goes on serving."""
    py, marker = _leaver(tmp_path, kind, "exit")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(py)), "--interval", "3600")
    bodies = srv.wait_runs_ended()
    assert all(b["reason"] == "bad-output" for b in bodies.values()), bodies
    assert _gone(marker) == []
    assert srv.terminate() == 0
    assert not marked_pids(srv.marker)


def test_a_monitor_run_past_its_deadline_leaves_nothing(start_server, tmp_path: Path):
    """The monitor's child hangs after a fork storm; at the monitor's deadline the child and
    all 100 are ended, while serve goes on serving."""
    py, marker = _leaver(tmp_path, "storm", "hang")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(py), HEALTHCHECK_TIMEOUT="0.5"),
                       "--interval", "3600")
    bodies = srv.wait_runs_ended(timeout=30)
    assert all(b["reason"] == "deadline" for b in bodies.values()), bodies
    assert _gone(marker) == []
    assert srv.terminate() == 0


def test_what_a_killed_cli_left_is_ended_by_serve(start_server, tmp_path: Path):
    """The monitor's child is the real CLI; descendants it does not know of (they were
    started before it) outlive it and are re-parented to serve, whose sweep ends them."""
    py, marker = _leaver(tmp_path, "double-fork", "cli")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(py)), "--interval", "3600")
    bodies = srv.wait_runs_ended()
    assert all(b["status"] == "pass" for b in bodies.values()), bodies
    assert _gone(marker) == []
    assert srv.terminate() == 0


@pytest.mark.parametrize("kind", [*KINDS, "term-fork"])
def test_sigterm_ends_what_runs_in_flight_left(start_server, tmp_path: Path, kind: str):
    py, marker = _leaver(tmp_path, kind, "hang")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(py), HEALTHCHECK_TIMEOUT="60"),
                       "--interval", "3600")
    end = time.monotonic() + 20
    needle = marker if kind == "term-fork" else f"{marker}-hang"
    while sum(needle in " ".join(p.info["cmdline"] or []) for p in leftovers(marker)) < 3:
        assert time.monotonic() < end, "the three runs did not start"
        time.sleep(0.1)
    time.sleep(0.5)  # the descendants are on their way (a daemon's python starts, the storm forks)
    t0 = time.monotonic()
    assert srv.terminate() == 0
    assert time.monotonic() - t0 < 8
    assert _gone(marker) == []
    assert not marked_pids(srv.marker)


def test_serve_without_the_serve_extra_is_one_usage_line(tmp_path):
    """prometheus-client is the serve extra: without it serve says what to install, exit 3."""
    import subprocess
    import sys

    from tests.conftest import ROOT, clean_env

    blocker = tmp_path / "sitecustomize.py"  # an environment where prometheus_client is not installed
    blocker.write_text("import sys\nclass _No:\n    def find_spec(self, name, path=None, target=None):\n"
                       "        if name.split('.')[0] == 'prometheus_client':\n"
                       "            raise ModuleNotFoundError(\"No module named 'prometheus_client'\", name=name)\n"
                       "sys.meta_path.insert(0, _No())\n")
    res = subprocess.run([sys.executable, "-m", "probes", "serve", "--port", "0"], cwd=ROOT, timeout=60,
                         env=clean_env(PYTHONPATH=str(tmp_path), HEALTHCHECK_STATE_DIR=str(tmp_path / "st")),
                         capture_output=True, text=True, check=False)
    assert res.returncode == 3 and "Traceback" not in res.stderr
    assert res.stderr.strip() == ("healthcheck serve: serve needs prometheus-client "
                                  "(accepted: pip install 'gpu-healthcheck[serve]')")
