"""`make bench`: what one health check costs, measured as Docker and the kubelet run it.

Each case is a whole process started through the front door (`./healthcheck --profile P`)
and reaped with os.wait4, which on Linux returns the resource use of the child and of
every descendant it reaped (bash -> timeout -> python -> nvidia-smi / the torch worker):

  wall   spawn to reap, milliseconds
  cpu    user + system time of the whole tree, milliseconds
  rss    ru_maxrss: the largest resident set of any one process in the tree, MiB

The cases run interleaved (round i of every case, then round i+1), so load from other
work on the machine falls on every case alike, next to two floors: `python -c pass` and
`python -c "import torch"` with the same interpreter. GPU checks are faked at the
driver boundary (a stub nvidia-smi on PATH, the fake libnvidia-ml.so.1 from tests/fakes
via LD_LIBRARY_PATH) or switched off when the fake library is missing; torch runs on the
CPU; a real sshd and a real Jupyter Server listen on loopback ports.

Usage: bench/run.py [--runs N] [--hang-runs N] [--cases a,b] [--no-services] [--json-only]
Results: bench/results/<timestamp>.json and bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import docker_exec  # bench/ beside this script

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.servers and tests.fakes
FRONT_DOOR = ROOT / "healthcheck"
VENV_PY = ROOT / ".venv" / "bin" / "python"
RESULTS = ROOT / "bench" / "results"
FAKE_NVML = ROOT / "tests" / "fakes" / "build" / "libnvidia-ml.so.1"
MIB = 1024.0  # ru_maxrss is in KiB on Linux
CHILD_LIMIT = 180.0  # a bench child that takes longer than this is killed and reported

# --vs DIR: these cases run again through DIR's front door (a checkout with its own .venv) in
# the same rounds, and each must stay within BASELINE_SLACK of it, the ratio taken pair by pair.
PAIRED = ("liveness", "readiness (torch cached)")
AT_BASELINE = " @ baseline"
BASELINE_SLACK = 0.05

# Targets (the verdicts printed under the table).
LIVENESS_FLOOR_FACTOR = 3.0
LIVENESS_RSS_MIB = 30.0
READINESS_FLOOR_FACTOR = 5.0
# An empty drop-in directory costs one scandir (microseconds): "no measurable time" is a
# median paired difference, liveness with it against liveness without, below this.
NO_TIME_MS = 1.0
HANG_SLACK = 0.5


# ---------------------------------------------------------------- measuring one process

class Sample:
    __slots__ = ("code", "cpu", "out", "rss", "wall")

    def __init__(self, wall: float, cpu: float, rss: float, code: int, out: str):
        self.wall, self.cpu, self.rss, self.code, self.out = wall, cpu, rss, code, out


LAUNCHER: str | None = None  # the compiled bench/spawn.c, when a C compiler is here


def build_launcher(work: Path) -> str | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    exe = work / "spawn"
    r = subprocess.run([cc, "-O2", "-o", str(exe), str(ROOT / "bench" / "spawn.c")],
                       capture_output=True, check=False)
    return str(exe) if r.returncode == 0 else None


def measure(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> Sample:
    """Run argv to completion; wall seconds, CPU seconds of its tree, max RSS MiB, exit code."""
    argv = [shutil.which(argv[0], path=env.get("PATH")) or argv[0], *argv[1:]]
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile("r") as res:
        t0 = time.perf_counter()
        launch = [LAUNCHER, res.name, *argv] if LAUNCHER else argv
        proc = subprocess.Popen(launch, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        # A watchdog so that a broken case cannot stall the benchmark.
        timer = threading.Timer(CHILD_LIMIT, _killpg, (proc.pid,))
        timer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped: keep Popen from waiting
        out.seek(0)
        text = out.read(16384).decode("utf-8", "replace")
        if LAUNCHER:
            fields = res.read().split()
            if len(fields) != 4:
                raise RuntimeError(f"launcher failed for {argv[0]}: {text[:200]}")
            return Sample(int(fields[0]) / 1e9, int(fields[1]) / 1e6, int(fields[2]) / MIB,
                          int(fields[3]), text)
    # Without the launcher ru_maxrss includes this process's own high-water mark (see spawn.c).
    return Sample(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / MIB, proc.returncode, text)


def _killpg(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def probe_elapsed(out: str, name: str) -> float | None:
    """A probe's own elapsed seconds from the text report line `STATUS name 0.123s message`."""
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == name and parts[2].endswith("s"):
            with contextlib.suppress(ValueError):
                return float(parts[2][:-1])
    return None


# ---------------------------------------------------------------- the boundary: servers and stubs

@contextlib.contextmanager
def sshd(work: Path) -> Iterator[tuple[int, dict[str, str]] | None]:
    """A real OpenSSH server on a loopback port (None when sshd is not installed), and the
    settings of a real probe login to it: a key authorized for root from loopback only, forced to
    /bin/true, as the image's probe principal is."""
    from tests.servers import Sshd  # the tests' own starter: one place knows how to run sshd

    if Sshd.missing() or not shutil.which("ssh"):
        yield None
        return
    root = work / "sshd"
    root.mkdir()
    key = root / "probe"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = root / "authorized_keys"
    pub = (root / "probe.pub").read_text()
    authorized.write_text(f'restrict,from="127.0.0.1,::1",command="/bin/true" {pub}')
    server = Sshd(root, ipv6=False, options=(f"AuthorizedKeysFile {authorized}",)).start()
    login = {"HEALTHCHECK_SSH_PROBE_KEY": str(key), "HEALTHCHECK_SSH_PROBE_USER": "root",
             "HEALTHCHECK_SSH_HOST_KEYS": f"{server.host_key}.pub", "HEALTHCHECK_SSH_USER": "root"}
    try:
        yield server.port, login
    finally:
        server.stop()


@contextlib.contextmanager
def jupyter(work: Path) -> Iterator[tuple[int, Path] | None]:
    """A real Jupyter Server on a loopback port, with its own runtime dir (None if missing)."""
    from tests.servers import Jupyter

    try:
        import jupyter_server  # noqa: F401
    except ImportError:
        yield None
        return
    (work / "jupyter").mkdir()
    server = Jupyter(work / "jupyter", token="bench-not-a-secret")
    try:
        yield server.port, server.runtime
    finally:
        server.stop()


SMI_STUB = r"""#!/usr/bin/env bash
# A healthy nvidia-smi with one GPU (bench fallback when tests/fakes has no stub writer).
case " $* " in
  *" -L "*) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0000abc0-fake-4000-8000-000000000000)"; exit 0 ;;
esac
q=
for a in "$@"; do case "$a" in --query-gpu=*) q=${a#--query-gpu=} ;; esac; done
[ -n "$q" ] || { echo "NVIDIA-SMI 550.54.15  Driver Version: 550.54.15  CUDA Version: 12.4"; exit 0; }
IFS=, read -ra keys <<<"$q"
row=
for k in "${keys[@]}"; do
  case "$k" in
    count) v=1 ;; index) v=0 ;; name) v="NVIDIA H100 80GB HBM3" ;;
    uuid) v=GPU-0000abc0-fake-4000-8000-000000000000 ;; driver_version) v=550.54.15 ;;
    pci.bus_id) v=00000000:41:00.0 ;; compute_mode) v=Default ;; *) v="[N/A]" ;;
  esac
  row=${row:+$row, }$v
done
echo "$row"
"""

HANG_SMI = """#!/usr/bin/env bash
# nvidia-smi wedged in the driver: never answers.
exec -a {marker}-smi sleep 600
"""

HANG_SMI_NASTY = """#!/usr/bin/env bash
# nvidia-smi that ignores SIGTERM and leaves a grandchild holding its stdout.
trap '' TERM
(trap '' TERM; exec -a {marker}-grandchild sleep 600) &
exec -a {marker}-smi-noterm sleep 600
"""

HANG_TORCH = """#!/usr/bin/env bash
# The image's python, stuck (a CUDA call that never returns).
trap '' TERM
exec -a {marker}-torch sleep 600
"""


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def write_healthy_smi(bin_dir: Path) -> str:
    """A compiled stub nvidia-smi (bench/nvidia-smi.c) when a C compiler is here, else a script."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        source = ROOT / "bench" / "nvidia-smi.c"
        r = subprocess.run([cc, "-O2", "-o", str(bin_dir / "nvidia-smi"), str(source)],
                           capture_output=True, check=False)
        if r.returncode == 0:
            return "bench/nvidia-smi.c, compiled (1 GPU)"
    write_exe(bin_dir / "nvidia-smi", SMI_STUB)
    return "bench script stub (1 GPU): no C compiler"


def leftovers(marker: str) -> list[int]:
    """Processes anywhere whose command line carries our marker (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd:
            found.append(int(entry))
    return found


# ---------------------------------------------------------------- the benchmark

class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.py = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))
        self.work = Path(tempfile.mkdtemp(prefix="hcbench-"))
        # Only the hang stubs carry this in their command line (the servers' paths do not).
        self.marker = f"hcbench{os.getpid()}x{os.urandom(3).hex()}"
        self.base_env: dict[str, str] = {}
        self.gpu_mode = ""
        self.services: dict[str, str] = {}
        self.ssh_login: dict[str, str] = {}  # a real probe login's settings (see sshd())

    def env(self, **extra: str) -> dict[str, str]:
        e = dict(self.base_env)
        e.update(extra)
        return e

    def prepare(self, ssh: tuple[int, dict[str, str]] | None, jup: tuple[int, Path] | None) -> None:
        ssh_port, self.ssh_login = (ssh[0], ssh[1]) if ssh else (None, {})
        bin_dir = self.work / "bin"
        bin_dir.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ENABLE_", "HEALTHCHECK_", "FAKE_NVML", "CUDA_", "NVIDIA_"))}
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
        env.update(HEALTHCHECK_PYTHON=self.py, HEALTHCHECK_TORCH_PYTHON=self.py,
                   HEALTHCHECK_TORCH_DEVICE="cpu", HEALTHCHECK_TORCH_TTL="3600",
                   HEALTHCHECK_STATE_DIR=str(self.work / "state"), HEALTHCHECK_FASTPATH="false",
                   HEALTHCHECK_CHECKS_DIR=str(self.work / "no-checks"),  # missing: no drop-ins
                   # What a run tells the person (paid as in the image) stays in the work dir.
                   HEALTHCHECK_NOTICE_FILE=str(self.work / "notice" / "notice"),
                   _HEALTHCHECK_NOTICE_LOG=str(self.work / "pid1-stderr"),
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        if not FAKE_NVML.exists() and shutil.which("make") and (ROOT / "tests/fakes/Makefile").exists():
            subprocess.run(["make", "-s", "-C", str(ROOT / "tests/fakes")], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if FAKE_NVML.exists() and not self.args.gpu_off:
            stub = write_healthy_smi(bin_dir)
            scenario = write_exe(self.work / "nvml.scenario", "gpus 1\n")
            env.update(LD_LIBRARY_PATH=f"{FAKE_NVML.parent}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":"),
                       FAKE_NVML_SCENARIO=str(scenario), ENABLE_GPU_CHECK="true",
                       HEALTHCHECK_GPU_COUNT="1")
            self.gpu_mode = f"faked: stub nvidia-smi on PATH ({stub}) + fake NVML via LD_LIBRARY_PATH"
        else:
            env["ENABLE_GPU_CHECK"] = "false"
            why = "--gpu-off" if self.args.gpu_off else f"{FAKE_NVML.relative_to(ROOT)} missing"
            self.gpu_mode = f"off: ENABLE_GPU_CHECK=false ({why})"
        if ssh_port:
            env["HEALTHCHECK_SSH_PORT"] = str(ssh_port)
            self.services["ssh"] = f"real sshd on 127.0.0.1:{ssh_port}"
        else:
            env["ENABLE_SSH_CHECK"] = "false"
            self.services["ssh"] = "off (no sshd: apt-get install -y openssh-server)"
        if jup:
            env["HEALTHCHECK_JUPYTER_PORT"] = str(jup[0])
            env["HEALTHCHECK_JUPYTER_RUNTIME_DIR"] = str(jup[1])
            self.services["jupyter"] = f"real Jupyter Server on 127.0.0.1:{jup[0]}"
        else:
            env["ENABLE_JUPYTER_CHECK"] = "false"
            self.services["jupyter"] = "off (no jupyter-server in .venv)"
        self.base_env = env

    # Each case: (name, kind, argv, env factory run before every sample)
    def cases(self) -> list[tuple[str, str, list[str], Callable[[int], dict[str, str]]]]:
        hc = str(FRONT_DOOR)
        cold_root = self.work / "cold"
        cold_root.mkdir()
        empty_checks = self.work / "checks-empty"
        empty_checks.mkdir()

        def fixed(e: dict[str, str]) -> Callable[[int], dict[str, str]]:
            return lambda i: e

        def fresh_state(i: int) -> dict[str, str]:
            return self.env(HEALTHCHECK_STATE_DIR=str(cold_root / f"s{i}"))

        all_cases = [
            ("floor: python -c pass", "floor", [self.py, "-c", "pass"], fixed(self.env())),
            ("floor: python -c 'import torch'", "floor", [self.py, "-c", "import torch"], fixed(self.env())),
            ("liveness", "profile", [hc, "--profile", "liveness"], fixed(self.env())),
            ("liveness (empty drop-in dir)", "profile", [hc, "--profile", "liveness"],
             fixed(self.env(HEALTHCHECK_CHECKS_DIR=str(empty_checks)))),
            ("readiness (torch cached)", "profile", [hc, "--profile", "readiness"], fixed(self.env())),
            ("readiness (cold state dir)", "profile", [hc, "--profile", "readiness"], fresh_state),
            ("startup (torch fresh)", "profile", [hc, "--profile", "startup"], fixed(self.env())),
        ]
        if self.ssh_login:  # the SSH user's key files and a login (cached after warm-up): what they add
            all_cases.append(("readiness + ssh-keys, ssh-login", "profile", [hc, "--profile", "readiness"],
                              fixed(self.env(**self.ssh_login))))
        if self.args.vs:  # the same cases through a baseline checkout, in the same rounds
            base = Path(self.args.vs).resolve()
            twin = self.env(HEALTHCHECK_PYTHON=str(base / ".venv" / "bin" / "python"),
                            HEALTHCHECK_STATE_DIR=str(self.work / "state-baseline"))
            all_cases += [(f"{name}{AT_BASELINE}", kind, [str(base / "healthcheck"), *argv[1:]], fixed(twin))
                          for name, kind, argv, _ in all_cases if name in PAIRED]
        if self.args.cases:
            wanted = [c.strip() for c in self.args.cases.split(",")]
            all_cases = [c for c in all_cases if c[1] == "floor" or any(w in c[0] for w in wanted)]
        return all_cases

    def run_cases(self) -> dict[str, Any]:
        cases = self.cases()
        # Warm the page cache and the torch result cache; none of this is measured.
        for _, _, argv, envf in cases:
            measure(argv, envf(-1))
        samples: dict[str, list[Sample]] = {name: [] for name, *_ in cases}
        for i in range(self.args.runs):
            for name, _, argv, envf in cases:
                samples[name].append(measure(argv, envf(i)))
            if not self.args.json_only and sys.stderr.isatty():
                print(f"\r  round {i + 1}/{self.args.runs}", end="", file=sys.stderr, flush=True)
        if not self.args.json_only and sys.stderr.isatty():
            print("\r" + " " * 30 + "\r", end="", file=sys.stderr)
        out: dict[str, Any] = {}
        for name, kind, argv, _ in cases:
            s = samples[name]
            torch_s = [t for t in (probe_elapsed(x.out, "torch-cuda") for x in s) if t is not None]
            ssh_s = {p: [t for t in (probe_elapsed(x.out, p) for x in s) if t is not None]
                     for p in ("ssh-keys", "ssh-login")}
            bad = [x for x in s if x.code != 0]
            out[name] = {
                "kind": kind,
                "argv": [a.replace(str(ROOT) + "/", "") for a in argv],
                "runs": len(s),
                "wall_ms": [round(x.wall * 1000, 2) for x in s],
                "cpu_ms": [round(x.cpu * 1000, 2) for x in s],
                "rss_mib": [round(x.rss, 2) for x in s],
                "exit_codes": sorted({x.code for x in s}),
                "failures": len(bad),
                "first_failure": bad[0].out.splitlines()[0] if bad and bad[0].out else None,
                "torch_probe_s": torch_s,
                # a kernel started through Jupyter Server (startup), or its cached pass (readiness)
                "kernel_probe_s": [t for t in (probe_elapsed(x.out, "jupyter-kernel") for x in s)
                                   if t is not None],
                "ssh_probe_s": {p: t for p, t in ssh_s.items() if t},
                "sample_output": s[-1].out[:1000] if s else "",
            }
        return out

    def run_hangs(self) -> dict[str, Any]:
        """Time from a hang to our answer against HEALTHCHECK_TIMEOUT."""
        timeout = self.args.hang_timeout
        results: dict[str, Any] = {}
        variants = [
            ("nvidia-smi hangs", HANG_SMI, None, "readiness"),
            ("nvidia-smi ignores TERM + grandchild holds pipe", HANG_SMI_NASTY, None, "readiness"),
            ("torch worker hangs, ignores TERM", None, HANG_TORCH, "startup"),
        ]
        for name, smi, torch, profile in variants:
            d = self.work / f"hang-{len(results)}"
            bin_dir = d / "bin"
            bin_dir.mkdir(parents=True)
            extra = {"HEALTHCHECK_TIMEOUT": f"{timeout:g}", "HEALTHCHECK_STATE_DIR": str(d / "state"),
                     "PATH": f"{bin_dir}:{self.base_env['PATH']}"}
            if smi:
                write_exe(bin_dir / "nvidia-smi", smi.format(marker=self.marker))
                extra.update(ENABLE_GPU_CHECK="true", ENABLE_TORCH_CHECK="false")
            if torch:
                extra["HEALTHCHECK_TORCH_PYTHON"] = str(
                    write_exe(bin_dir / "python-hangs", torch.format(marker=self.marker)))
            argv = [str(FRONT_DOOR), "--profile", profile]
            walls, codes, left, first = [], set(), 0, ""
            for _ in range(self.args.hang_runs):
                s = measure(argv, self.env(**extra))
                walls.append(s.wall)
                codes.add(s.code)
                first = first or (s.out.splitlines() or [""])[0]
                time.sleep(0.3)  # the kernel delivers SIGKILL asynchronously
                stray = leftovers(self.marker)
                left += len(stray)
                for pid in stray:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            results[name] = {"profile": profile, "timeout_s": timeout, "runs": len(walls),
                             "wall_s": [round(w, 3) for w in walls], "exit_codes": sorted(codes),
                             "leftover_processes": left, "output": first[:200]}
        return results


def fmt_ms(v: float) -> str:
    return f"{v:8.0f}" if v >= 100 else f"{v:8.1f}"


def git_info() -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True,
                                  timeout=10, check=False).stdout.strip()
        except OSError:
            return ""
    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def summarise(cases: dict[str, Any], hangs: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    lines = []
    head = (f"{'case':<34}{'wall med':>9}{'p95':>8}{'cpu med':>9}{'p95':>8}{'rss med':>9}{'max':>7}"
            f"{'x floor':>8}  exit")
    lines += [head, "-" * len(head)]
    floor = cases.get("floor: python -c pass")
    floor_med = statistics.median(floor["wall_ms"]) if floor else float("nan")
    for name, c in cases.items():
        w, cpu, rss = c["wall_ms"], c["cpu_ms"], c["rss_mib"]
        med = statistics.median(w)
        ratio = med / floor_med if floor_med == floor_med and floor_med > 0 else float("nan")
        codes = ",".join(str(x) for x in c["exit_codes"])
        lines.append(f"{name:<34}{fmt_ms(med)} {fmt_ms(pct(w, 95))[1:]}{fmt_ms(statistics.median(cpu))} "
                     f"{fmt_ms(pct(cpu, 95))[1:]}{statistics.median(rss):8.1f} {max(rss):6.1f}"
                     f"{ratio:7.1f}x  {codes}")
        c["summary"] = {"wall_ms_median": med, "wall_ms_p95": pct(w, 95),
                        "cpu_ms_median": statistics.median(cpu), "cpu_ms_p95": pct(cpu, 95),
                        "rss_mib_median": statistics.median(rss), "rss_mib_max": max(rss),
                        "x_floor": ratio}
    lines.append("(wall/cpu in ms; cpu = user+sys of the whole process tree; rss = ru_maxrss, MiB, "
                 "of the largest process in the tree)")
    for name, c in cases.items():
        if c["failures"]:
            lines.append(f"  ! {name}: {c['failures']}/{c['runs']} runs exited non-zero: "
                         f"{c['first_failure']}")

    # The torch op, cold against cached.
    torch_rows = [(n, c["torch_probe_s"]) for n, c in cases.items() if c["torch_probe_s"]]
    if torch_rows:
        lines += ["", "torch-cuda probe's own elapsed time (from the report line):"]
        for n, t in torch_rows:
            lines.append(f"  {n:<32} median {statistics.median(t) * 1000:8.1f} ms   "
                         f"p95 {pct(t, 95) * 1000:8.1f} ms")

    kernel_rows = [(n, c.get("kernel_probe_s")) for n, c in cases.items() if c.get("kernel_probe_s")]
    if kernel_rows:
        lines += ["", "jupyter-kernel probe's own elapsed time (a kernel started, or its cached pass):"]
        for n, t in kernel_rows:
            lines.append(f"  {n:<32} median {statistics.median(t) * 1000:8.1f} ms   "
                         f"p95 {pct(t, 95) * 1000:8.1f} ms")

    ssh_rows = [(n, p, t) for n, c in cases.items() for p, t in c.get("ssh_probe_s", {}).items()]
    if ssh_rows:
        lines += ["", "ssh-keys (static) and ssh-login (its cached pass) probes' own elapsed time:"]
        for n, p, t in ssh_rows:
            lines.append(f"  {n:<32} {p:<10} median {statistics.median(t) * 1000:8.1f} ms   "
                         f"p95 {pct(t, 95) * 1000:8.1f} ms")

    if hangs:
        lines += ["", f"hangs: wall time from start to answer vs HEALTHCHECK_TIMEOUT "
                      f"(target: within +{HANG_SLACK:g}s)"]
        for n, h in hangs.items():
            lines.append(f"  {n:<48} timeout {h['timeout_s']:g}s  "
                         f"median {statistics.median(h['wall_s']):.2f}s  max {max(h['wall_s']):.2f}s  "
                         f"exit {','.join(map(str, h['exit_codes']))}"
                         f"  leftovers {h['leftover_processes']}")

    targets: list[dict[str, Any]] = []

    def target(what: str, ok: bool | None, detail: str) -> None:
        targets.append({"target": what, "met": ok, "detail": detail})

    live = cases.get("liveness")
    if live and floor:
        m = live["summary"]["wall_ms_median"]
        target(f"liveness median <= {LIVENESS_FLOOR_FACTOR:g}x floor", m <= LIVENESS_FLOOR_FACTOR * floor_med
               and not live["failures"], f"{m:.1f} ms vs {LIVENESS_FLOOR_FACTOR * floor_med:.1f} ms "
               f"({m / floor_med:.1f}x {floor_med:.1f} ms)")
        r = live["summary"]["rss_mib_max"]
        target(f"liveness peak RSS < {LIVENESS_RSS_MIB:g} MiB", r < LIVENESS_RSS_MIB, f"max {r:.1f} MiB")
    empty = cases.get("liveness (empty drop-in dir)")
    if live and empty:
        pairs = [e - b for e, b in zip(empty["wall_ms"], live["wall_ms"])]
        d = statistics.median(pairs)
        target("an empty drop-in directory adds no measurable time",
               d <= NO_TIME_MS and not empty["failures"],
               f"median paired difference {d:+.1f} ms (under {NO_TIME_MS:g} ms; {len(pairs)} pairs)")
    ready = cases.get("readiness (torch cached)")
    if ready and floor:
        m = ready["summary"]["wall_ms_median"]
        target(f"readiness (cached) median <= {READINESS_FLOOR_FACTOR:g}x floor",
               m <= READINESS_FLOOR_FACTOR * floor_med and not ready["failures"],
               f"{m:.1f} ms vs {READINESS_FLOOR_FACTOR * floor_med:.1f} ms ({m / floor_med:.1f}x)")
    for n, h in hangs.items():
        worst = max(h["wall_s"]) - h["timeout_s"]
        ok = worst <= HANG_SLACK and h["exit_codes"] == [1] and not h["leftover_processes"]
        target(f"hang answered within {HANG_SLACK:g}s of deadline: {n}", ok,
               f"worst {worst:+.2f}s vs deadline, exit {h['exit_codes']}, "
               f"leftovers {h['leftover_processes']}")
    for name in PAIRED:
        new, old = cases.get(name), cases.get(name + AT_BASELINE)
        if new and old:
            ratios = {k: statistics.median([a / b for a, b in zip(new[k], old[k]) if b > 0])
                      for k in ("wall_ms", "cpu_ms")}
            target(f"{name} within {BASELINE_SLACK:.0%} of the baseline (paired, round by round)",
                   max(ratios.values()) <= 1 + BASELINE_SLACK and not new["failures"],
                   f"median ratio wall {ratios['wall_ms']:.3f}, cpu {ratios['cpu_ms']:.3f} "
                   f"({len(new['wall_ms'])} pairs)")
    lines += ["", "targets:"]
    for t in targets:
        lines.append(f"  {'MET    ' if t['met'] else 'NOT MET'}  {t['target']}: {t['detail']}")
    return lines, targets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="samples per case (default 20)")
    p.add_argument("--hang-runs", type=int, default=5, help="samples per hang variant (default 5)")
    p.add_argument("--hang-timeout", type=float, default=2.0, help="HEALTHCHECK_TIMEOUT for the hangs")
    p.add_argument("--cases", help="substrings of the case names to run (floors always run)")
    p.add_argument("--no-services", action="store_true", help="do not start sshd and Jupyter Server")
    p.add_argument("--no-docker", action="store_true", help="skip the docker exec case")
    p.add_argument("--no-hangs", action="store_true", help="skip the hang measurements")
    p.add_argument("--gpu-off", action="store_true", help="ENABLE_GPU_CHECK=false even with the fake NVML")
    p.add_argument("--json-only", action="store_true", help="print only the JSON result")
    p.add_argument("--vs", metavar="DIR", help="a baseline checkout (with its .venv): liveness and cached "
                   "readiness run through its front door too, paired round by round")
    args = p.parse_args(argv)
    if args.runs < 1 or args.hang_runs < 1:
        p.error("--runs and --hang-runs must be at least 1")

    global LAUNCHER
    bench = Bench(args)
    LAUNCHER = build_launcher(bench.work)
    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        with contextlib.ExitStack() as stack:
            ssh = None if args.no_services else stack.enter_context(sshd(bench.work))
            jup = None if args.no_services else stack.enter_context(jupyter(bench.work))
            bench.prepare(ssh, jup)
            load_before = os.getloadavg()
            cases = bench.run_cases()
            hangs = {} if args.no_hangs else bench.run_hangs()
            docker = {"skipped": "--no-docker"} if args.no_docker else docker_exec.run(args.runs)
            load_after = os.getloadavg()
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)

    lines, targets = summarise(cases, hangs)
    docker_lines, docker_targets = docker_exec.summary(docker)
    lines += ["", *docker_lines]
    for what, ok, detail in docker_targets:
        lines.append(f"  {'MET    ' if ok else 'NOT MET'}  {what}: {detail}")
        targets.append({"target": what, "met": ok, "detail": detail})
    info = git_info()
    header = [
        f"healthcheck bench  {started:%Y-%m-%d %H:%M:%S}Z  commit {(info['commit'] or '?')[:12]}"
        f"{' (dirty)' if info['dirty'] else ''}  python {platform.python_version()}  "
        f"{os.cpu_count()} cores  load {load_before[0]:.2f}->{load_after[0]:.2f}",
        f"gpu: {bench.gpu_mode}",
        "torch: HEALTHCHECK_TORCH_DEVICE=cpu, HEALTHCHECK_TORCH_PYTHON="
        + bench.py.replace(str(ROOT) + "/", ""),
        "services: " + "; ".join(bench.services.values()),
        f"runs: {args.runs} per case through ./healthcheck, interleaved; measured by "
        + ("bench/spawn.c (fork, execv, wait4)" if LAUNCHER else
           "wait4 from the bench itself (no C compiler: rss is an upper bound)"), "",
    ]
    doc = {
        "time": started.isoformat(timespec="seconds"),
        **info,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "loadavg": {"before": load_before, "after": load_after},
        "gpu": bench.gpu_mode,
        "launcher": "bench/spawn.c" if LAUNCHER else "python wait4",
        "services": bench.services,
        "runs": args.runs,
        "cases": cases,
        "hangs": hangs,
        "docker_exec": docker,
        "targets": targets,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    (RESULTS / f"{started:%Y%m%dT%H%M%SZ}.json").write_text(text)
    (RESULTS / "latest.json").write_text(text)
    if args.json_only:
        print(text)
    else:
        print("\n".join(header + lines))
        print(f"\nresults: {RESULTS.relative_to(ROOT)}/{started:%Y%m%dT%H%M%SZ}.json (and latest.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
