"""The Kubernetes probes, exercised against a running container the way the kubelet runs them.

Each probe's command, periodSeconds, timeoutSeconds and failureThreshold are read from the
RENDERED manifest (`kubectl kustomize k8s/base`), not copied here. A small driver plays the
kubelet's part: it runs the exec command in the container (`docker exec`, like the CRI's
ExecSync), treats timeoutSeconds as a hard timeout on that call, and counts consecutive
failures against failureThreshold. Like the kubelet's probe worker, the next run of a probe
starts one period after the previous run started, or at once when the run took longer than
the period (the ticker drops missed ticks).

Time is scaled: the driver keeps a virtual clock in which the manifest's real periods
elapse, and sleeps only SCALE (1/20) of each virtual gap, so a 60 s liveness window
takes a few seconds. Thresholds and timeouts are the real ones, and every probe run is a
real, whole `healthcheck` process in the container, so a run that takes longer than a
period advances the virtual clock by its real duration.

Shown here:
- the startup probe passes on a healthy container (it gates the other two);
- stopping Jupyter fails readiness first (after 2 failures) and liveness only at its own
  threshold (6 failures), later on the same clock;
- a hung `nvidia-smi` (a stub that sleeps, mounted on PATH, GPU checks on) fails readiness
  with the probe's own deadline reason while liveness, which never calls the GPU, keeps
  passing for twice its failureThreshold of runs (here the GPU hangs from the start, so the
  driver does not wait for the startup probe, which would fail on it too);
- no probe ever reaches the kubelet's timeoutSeconds: the front door ends every run first,
  and the stub's sleeping process does not outlive the run.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import docker, exec_in, inspect

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"
SCALE = 0.05  # real seconds slept per virtual second of the probe schedule
HTTP_SCALE = 0.2  # the same for the httpGet polls (serve's own schedule is not scaled)
FIELDS = ("startupProbe", "readinessProbe", "livenessProbe")
# The image has no GPU here: the e2e container runs torch on the CPU with the GPU layer off,
# except where a scenario turns it on over a stub. Docker's own HEALTHCHECK is off
# (--no-healthcheck): the kubelet ignores it, and it would run probes beside the driver's.
CPU_ENV = {"ENABLE_GPU_CHECK": "false", "HEALTHCHECK_TORCH_DEVICE": "cpu"}
HUNG_SMI = "#!/bin/sh\n# A wedged driver: nvidia-smi never answers.\nexec sleep 3600\n"


@dataclasses.dataclass(frozen=True)
class Probe:
    field: str
    command: tuple[str, ...]  # exec probes
    period: int
    timeout: int
    threshold: int
    path: str = ""  # httpGet probes: path and container port
    port: int = 0


def rendered(overlay: str = "k8s/base") -> tuple[dict[str, Probe], dict[str, str], dict[str, Any]]:
    """The probes, the container environment and the container of the rendered Deployment."""
    out = subprocess.run([str(KUBECTL), "kustomize", str(ROOT / overlay)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    [dep] = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports") or []}
    probes = {}
    for f in FIELDS:
        spec = c[f]
        get = spec.get("httpGet") or {}
        port = get.get("port", 0)
        probes[f] = Probe(f, tuple((spec.get("exec") or {}).get("command") or ()), spec["periodSeconds"],
                          spec["timeoutSeconds"], spec["failureThreshold"], get.get("path", ""),
                          ports.get(port, port) if isinstance(port, str) else port)
    env = {e["name"]: str(e["value"]) for e in c.get("env") or [] if "value" in e}
    return probes, env, c


@dataclasses.dataclass
class Attempt:
    at: float  # virtual time the run started
    ok: bool
    rc: int | None
    duration: float
    timed_out: bool
    output: str


def exec_probe(container: str, probe: Probe) -> tuple[bool, int | None, float, bool, str]:
    """One run, as the kubelet does it: exec in the container, timeoutSeconds as a hard limit.

    On a timeout only the `docker exec` client is killed; what runs inside the container
    is left alone, as the kubelet leaves it.
    """
    t0 = time.monotonic()
    try:
        done = subprocess.run(["docker", "exec", container, *probe.command], capture_output=True,
                              text=True, timeout=probe.timeout, check=False)
    except subprocess.TimeoutExpired:
        return False, None, time.monotonic() - t0, True, ""
    return done.returncode == 0, done.returncode, time.monotonic() - t0, False, done.stdout + done.stderr


def pod_ip(container: str) -> str:
    out = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                          container], capture_output=True, text=True, timeout=30, check=True).stdout.split()
    assert out, f"container {container} has no IP address"
    return out[0]


def http_probe(container: str, probe: Probe) -> tuple[bool, int | None, float, bool, str]:
    """One httpGet run, as the kubelet does it: GET the pod IP, 200-399 passes, timeoutSeconds."""
    url = f"http://{pod_ip(container)}:{probe.port}{probe.path}"
    t0 = time.monotonic()
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=probe.timeout) as r:
            body, code = r.read().decode(errors="replace"), r.status
    except urllib.error.HTTPError as exc:
        body, code = exc.read().decode(errors="replace"), exc.code
    except (TimeoutError, socket.timeout):
        return False, None, time.monotonic() - t0, True, ""
    except OSError as exc:  # refused, reset: a failure, like the kubelet's
        return False, None, time.monotonic() - t0, False, f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - t0
    try:
        output = str(json.loads(body).get("output", ""))
    except ValueError:
        output = body[:200]
    return 200 <= code < 400, code, took, False, f"HTTP {code} {output}"


class Worker:
    """The kubelet's probe worker for one probe, on the driver's virtual clock."""

    def __init__(self, probe: Probe, start: float) -> None:
        self.probe = probe
        self.next = start
        self.failures = 0
        self.tripped_at: float | None = None
        self.attempts: list[Attempt] = []

    def run(self, container: str) -> None:
        at = self.next
        how = http_probe if self.probe.path else exec_probe
        ok, rc, took, timed_out, output = how(container, self.probe)
        self.attempts.append(Attempt(at, ok, rc, took, timed_out, output))
        self.failures = 0 if ok else self.failures + 1
        if self.failures >= self.probe.threshold and self.tripped_at is None:
            self.tripped_at = at + took
        self.next = at + max(self.probe.period, took)


def drive(container: str, workers: list[Worker], *, done: Any, limit: float, scale: float = SCALE) -> float:
    """Run the workers in virtual-time order until done(workers) or the virtual limit; returns the clock."""
    clock = min(w.next for w in workers)
    while not done(workers):
        w = min(workers, key=lambda x: x.next)
        if w.next > limit:
            break
        time.sleep(max(0.0, w.next - clock) * scale)
        clock = w.next
        w.run(container)
    return clock


def summary(workers: list[Worker]) -> str:
    lines = []
    for w in workers:
        for a in w.attempts:
            first = a.output.strip().splitlines()[0] if a.output.strip() else ""
            lines.append(f"{w.probe.field} t={a.at:6.1f} ok={a.ok} rc={a.rc} took={a.duration:.1f}s "
                         f"timed_out={a.timed_out} {first[:160]}")
    return "\n".join(lines)


def wait_started(container: str, probes: dict[str, Probe], scale: float = SCALE) -> Worker:
    """The startup probe until it passes (failureThreshold x periodSeconds of virtual time)."""
    w = Worker(probes["startupProbe"], 0.0)
    drive(container, [w], done=lambda ws: bool(ws[0].attempts and ws[0].attempts[-1].ok) or ws[0].tripped_at,
          limit=float("inf"), scale=scale)
    assert w.attempts[-1].ok, "startup probe never passed:\n" + summary([w])
    assert not any(a.timed_out for a in w.attempts), summary([w])
    return w


def jupyter_pid(container: str) -> int:
    """The live server's pid, from the jpserver-<pid>.json it writes in its runtime dir."""
    out = subprocess.run(["docker", "exec", container, "sh", "-c", "ls /run/jupyter"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    pids = [int(n[len("jpserver-"):-len(".json")]) for n in out.split()
            if n.startswith("jpserver-") and n.endswith(".json")]
    assert len(pids) == 1, f"expected one jpserver-<pid>.json in /run/jupyter, found: {out.split()}"
    return pids[0]


def stop_jupyter(container: str) -> None:
    pid = jupyter_pid(container)
    subprocess.run(["docker", "exec", container, "kill", "-TERM", str(pid)], timeout=30, check=True)
    for _ in range(100):  # until the process is gone (it removes its runtime file on the way out)
        gone = subprocess.run(["docker", "exec", container, "test", "-d", f"/proc/{pid}"],
                              timeout=30, check=False).returncode != 0
        if gone:
            return
        time.sleep(0.2)
    raise AssertionError(f"jupyter (pid {pid}) did not stop within 20 s of SIGTERM")


def processes(container: str) -> list[str]:
    out = subprocess.run(["docker", "exec", container, "ps", "-eo", "args="], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


# --- the scenarios ---------------------------------------------------------------------------

def test_stopping_jupyter_fails_readiness_before_liveness(start_container: Any) -> None:
    probes, manifest_env, _ = rendered()
    container = start_container(env={**manifest_env, **CPU_ENV}, healthcheck=False)
    started = wait_started(container, probes)
    print(summary([started]))

    ready = Worker(probes["readinessProbe"], 0.0)
    live = Worker(probes["livenessProbe"], 0.0)
    drive(container, [ready, live], done=lambda ws: all(w.attempts for w in ws), limit=float("inf"))
    assert ready.attempts[0].ok and live.attempts[0].ok, "not healthy before the fault:\n" + summary([ready, live])

    stop_jupyter(container)
    limit = 4 * live.probe.threshold * live.probe.period
    drive(container, [ready, live], done=lambda ws: all(w.tripped_at is not None for w in ws), limit=limit)
    log = summary([ready, live])
    print(f"readiness out of the Service at t={ready.tripped_at}, liveness restart at t={live.tripped_at}\n{log}")

    assert ready.tripped_at is not None, "readiness never failed its threshold:\n" + log
    assert live.tripped_at is not None, "liveness never failed its threshold:\n" + log
    assert ready.tripped_at < live.tripped_at, "liveness gave up before readiness:\n" + log
    # Liveness restarts only after its own threshold: every failure before that was tolerated.
    fails = [a for a in live.attempts if not a.ok]
    assert len(fails) == live.probe.threshold, log
    assert all("jupyter" in a.output for a in fails + [a for a in ready.attempts if not a.ok]), log
    assert not any(a.timed_out for a in ready.attempts + live.attempts), log


def test_hung_gpu_fails_readiness_not_liveness(start_container: Any, tmp_path: Path) -> None:
    probes, manifest_env, _ = rendered()
    stub = tmp_path / "nvidia-smi"
    stub.write_text(HUNG_SMI)
    stub.chmod(0o755)
    container = start_container("-v", f"{stub}:/usr/local/bin/nvidia-smi:ro",
                                env={**manifest_env, **CPU_ENV, "ENABLE_GPU_CHECK": "true"},
                                healthcheck=False)

    ready = Worker(probes["readinessProbe"], 0.0)
    live = Worker(probes["livenessProbe"], 0.0)
    # Readiness until it gives up; liveness for a whole failureThreshold of runs (what it
    # would take to restart the container) beyond that.
    drive(container, [ready, live], done=lambda ws: ws[0].tripped_at is not None, limit=600)
    drive(container, [live], done=lambda ws: len(ws[0].attempts) >= 2 * live.probe.threshold,
          limit=float("inf"))
    log = summary([ready, live])
    print(f"readiness out of the Service at t={ready.tripped_at}\n{log}")

    assert ready.tripped_at is not None, "readiness never failed on a hung nvidia-smi:\n" + log
    assert all("nvidia-smi" in a.output for a in ready.attempts if not a.ok), log
    assert all(a.ok for a in live.attempts), "liveness failed on a hung GPU:\n" + log
    # The front door, not the kubelet's timeout, ended every run, and killed the hung child.
    assert not any(a.timed_out for a in ready.attempts + live.attempts), log
    assert all(a.duration < a_probe.timeout for a, a_probe in
               [(a, ready.probe) for a in ready.attempts] + [(a, live.probe) for a in live.attempts]), log
    leftovers = [p for p in processes(container) if p.startswith("sleep 3600")]
    assert not leftovers, f"the hung nvidia-smi outlived its probe runs: {leftovers}"


def security_args(c: dict[str, Any]) -> list[str]:
    """The container's securityContext as `docker run` options (RuntimeDefault seccomp is Docker's
    default profile), so the container runs as locked down as the manifest has it."""
    sc = c.get("securityContext") or {}
    caps = sc.get("capabilities") or {}
    args = [f"--cap-drop={x}" for x in caps.get("drop") or []] + [f"--cap-add={x}" for x in caps.get("add") or []]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    assert (sc.get("seccompProfile") or {}).get("type") in (None, "RuntimeDefault")
    return args


def test_http_overlay_serve_started_by_the_entrypoint(start_container: Any) -> None:
    """The http overlay: the image's entrypoint starts serve (HEALTHCHECK_SERVE=true), the
    kubelet's httpGet reaches it, and it runs with the manifest's capabilities and no_new_privs.

    serve runs its profiles on its own real-time schedule (HEALTHCHECK_SERVE_INTERVAL from
    the manifest), so here the kubelet's polls are scaled by HTTP_SCALE and only the number
    of failed polls, not clock times, is compared.
    """
    probes, manifest_env, c = rendered("k8s/overlays/http")
    assert "lifecycle" not in c and manifest_env["HEALTHCHECK_SERVE"] == "true"
    container = start_container(*security_args(c), env={**manifest_env, **CPU_ENV}, healthcheck=False)

    wait_started(container, probes, scale=HTTP_SCALE)
    ready = Worker(probes["readinessProbe"], 0.0)
    live = Worker(probes["livenessProbe"], 0.0)
    # /readyz and /livez turn 200 once serve's first runs of those profiles passed.
    drive(container, [ready, live], done=lambda ws: all(w.attempts and w.attempts[-1].ok for w in ws),
          limit=600, scale=HTTP_SCALE)
    assert ready.attempts[-1].ok and live.attempts[-1].ok, "not healthy before the fault:\n" + summary(
        [ready, live])
    ready.attempts.clear()
    live.attempts.clear()
    ready.failures = live.failures = 0

    stop_jupyter(container)
    drive(container, [ready, live], done=lambda ws: all(w.tripped_at is not None for w in ws),
          limit=ready.next + 600, scale=HTTP_SCALE)
    log = summary([ready, live])
    print(log)

    assert ready.tripped_at is not None and live.tripped_at is not None, log
    assert ready.tripped_at < live.tripped_at, "liveness gave up before readiness:\n" + log
    assert [a.rc for a in live.attempts if not a.ok] == [503] * live.probe.threshold, log
    assert all("jupyter" in a.output.lower() for a in ready.attempts + live.attempts if not a.ok), log
    assert not any(a.timed_out for a in ready.attempts + live.attempts), log
    # sshd kept passing under the dropped capabilities (the API server's verbose form says which
    # check failed); docker stop ends serve with the rest.
    url = f"http://{pod_ip(container)}:{ready.probe.port}/readyz?verbose"
    try:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10)
        raise AssertionError("readiness passed with Jupyter stopped")
    except urllib.error.HTTPError as exc:
        verbose = exc.read().decode(errors="replace").splitlines()
    assert "[+]ssh ok" in verbose and any(line.startswith("[-]jupyter failed") for line in verbose), verbose
    assert verbose[-1] == "readyz check failed", verbose
    docker("stop", "-t", "20", container, timeout=60)  # raises with docker's stderr if it fails
    logs = docker("logs", container, timeout=30)
    assert "healthcheck serve started" in logs.stderr and "stopping sshd, jupyter and healthcheck serve" in (
        logs.stderr), logs.stderr[-2000:]


def test_ssh_login_and_jupyter_work_under_the_manifest_security_context(start_container: Any) -> None:
    """The capabilities the manifest keeps are enough for a real key login and for Jupyter,
    with no_new_privs on; and the image carries its OCI labels."""
    _, _, c = rendered("k8s/base")
    args = security_args(c)
    keygen = start_container(*args, healthcheck=False, command=(
        "bash", "-c", "ssh-keygen -q -t ed25519 -N '' -C e2e -f /tmp/k && cat /tmp/k.pub /tmp/k"))
    docker("wait", keygen)
    lines = docker("logs", keygen).stdout.splitlines()
    public, private = lines[0], "\n".join(lines[1:]) + "\n"
    cid = start_container(*args, healthcheck=False, env={"SSH_AUTHORIZED_KEYS": public})
    end = time.monotonic() + 90
    while exec_in(cid, "healthcheck", "--only", "jupyter,ssh", check=False).returncode != 0:
        assert time.monotonic() < end, docker("logs", cid).stderr[-2000:]
        time.sleep(1)
    status = exec_in(cid, "cat", "/proc/1/status").stdout
    assert "NoNewPrivs:\t1" in status, status
    exec_in(cid, "bash", "-c", "umask 077 && cat >/tmp/k", input=private)
    ok = exec_in(cid, "ssh", "-i", "/tmp/k", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                 "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "dev@127.0.0.1", "id", "-un",
                 check=False)
    assert (ok.returncode, ok.stdout.strip()) == (0, "dev"), ok.stderr
    image_labels = inspect(docker("inspect", "--format", "{{.Image}}", cid).stdout.strip())["Config"]["Labels"]
    for key in ("title", "description", "version", "licenses"):
        assert image_labels.get(f"org.opencontainers.image.{key}"), (key, image_labels)
