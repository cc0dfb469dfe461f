"""`make bench`: what a health check costs as Docker and the kubelet run it, and what the notices
cost the person at a login and a kernel's start (docs/benchmark.md)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.servers
RESULTS = ROOT / "bench" / "results"
FAKE_NVML = ROOT / "tests" / "fakes" / "build" / "libnvidia-ml.so.1"
IMAGE = os.environ.get("E2E_IMAGE", "gpu-dev:e2e")  # what make e2e builds
BASELINE = "/opt/healthcheck-baseline"  # --vs in the container: the baseline's front door and source tree
CHILD_LIMIT = 180.0  # a case that takes longer is killed (the front door's own deadline comes first)
READY_WAIT = 180.0  # for the container's first passing readiness run (Jupyter's start, torch cached)

FLOOR, DOCKER_FLOOR = "floor: python -c pass", "docker exec: true (floor)"
# Targets: a case's median wall time at most FACTOR x its floor's, with no failed run.
FACTORS = {"liveness": 3.0, "readiness (torch cached)": 5.0,
           "docker exec: liveness": 1.6, "docker exec: readiness (torch cached)": 1.7}
LIVENESS_RSS_MIB = 30.0
# --vs: each must stay within BASELINE_SLACK of the baseline, by the median of per-round ratios.
PAIRED, BASELINE_SLACK = ("liveness", "readiness (torch cached)"), 0.05
NOTICE_MS = 5.0  # what a login's or a kernel's notice may add, median of per-round CPU differences
NOTICES = {"unhealthy": "{now} 86400 unhealthy 10:42 UTC\nunhealthy since 10:40 UTC: nvml: GPU 0 is lost\n"
           "not fixable from inside this container\n", "healthy": "{now} 86400 healthy 10:42 UTC\n"}
# A kernel's start as IPython runs it, the shell already made: the hook's configuration (with), then
# the first cell. It prints the CPU ms of that part alone: the interpreter's start would drown it.
KERNEL = """
import sys, time
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config.loader import PyFileConfigLoader
shell = InteractiveShell.instance()
t0 = time.process_time()
if sys.argv[1] == "with":
    config = PyFileConfigLoader("ipython_kernel_config.py", path=sys.argv[2]).load_config()
    for line in config.InteractiveShellApp.exec_lines.get_value([]):
        shell.run_cell(line, store_history=False)
shell.run_cell("x = 1", store_history=True)
print((time.process_time() - t0) * 1000)
"""


@dataclass(eq=False)
class Case:
    name: str
    argv: list[str]
    env: dict[str, str]
    floor: str = FLOOR
    kind: str = "profile"  # floor, profile, baseline, docker exec, notice
    pair: Case | None = None  # measured against it, round by round
    own: bool = True  # CPU and RSS are the case's (not the docker client's)
    own_cpu: bool = False  # its output's last word is its CPU ms
    samples: list[tuple[float, float, float, int, str]] = field(default_factory=list)


def measure(launcher: str, case: Case) -> tuple[float, float, float, int, str]:
    """(wall ms, CPU ms of the tree, peak RSS MiB, exit code, output) of one run of the case."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile("r") as res:
        proc = subprocess.Popen([launcher, res.name, *case.argv], env=case.env, cwd=ROOT,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(CHILD_LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        text = out.read(16384).decode("utf-8", "replace")
        fields = res.read().split()
    if len(fields) != 4:  # killed at CHILD_LIMIT: a failed run, not a measurement
        return (time.perf_counter() - start) * 1000, 0.0, 0.0, proc.returncode, f"no measurement\n{text}"
    wall_ns, cpu_us, rss_kib, code = map(int, fields)
    cpu = float(text.split()[-1]) if case.own_cpu and code == 0 else cpu_us / 1e3
    return wall_ns / 1e6, cpu, rss_kib / 1024, code, text


def host_env(work: Path, py: str, stack: contextlib.ExitStack, services: dict[str, str]) -> dict[str, str]:
    from tests.servers import Jupyter, Sshd  # the tests' own starters: one place runs each server

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ENABLE_", "HEALTHCHECK_", "FAKE_NVML", "CUDA_", "NVIDIA_"))}
    env.update(PATH=f"{work / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
               LD_LIBRARY_PATH=f"{FAKE_NVML.parent}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":"),
               ENABLE_GPU_CHECK="true", HEALTHCHECK_GPU_COUNT="1", HEALTHCHECK_PYTHON=py,
               HEALTHCHECK_TORCH_PYTHON=py, HEALTHCHECK_TORCH_DEVICE="cpu", HEALTHCHECK_TORCH_TTL="3600",
               HEALTHCHECK_STATE_DIR=str(work / "state"),
               HEALTHCHECK_CHECKS_DIR=str(work / "no-checks"),  # missing: no drop-ins
               # What a run tells the person (paid as in the image) stays in the work dir.
               HEALTHCHECK_NOTICE_FILE=str(work / "notice" / "notice"),
               _HEALTHCHECK_NOTICE_LOG=str(work / "pid1-stderr"),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    if Sshd.missing():
        env["ENABLE_SSH_CHECK"], services["ssh"] = "false", "off (no sshd)"
    else:
        (work / "sshd").mkdir()
        sshd = Sshd(work / "sshd", ipv6=False).start()
        stack.callback(sshd.stop)
        env["HEALTHCHECK_SSH_PORT"], services["ssh"] = str(sshd.port), f"real sshd on 127.0.0.1:{sshd.port}"
    try:
        import jupyter_server  # noqa: F401
    except ImportError:
        env["ENABLE_JUPYTER_CHECK"], services["jupyter"] = "false", "off (no jupyter-server in .venv)"
    else:
        (work / "jupyter").mkdir()
        jup = Jupyter(work / "jupyter", token="bench-not-a-secret")
        stack.callback(jup.stop)
        env.update(HEALTHCHECK_JUPYTER_PORT=str(jup.port), HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(jup.runtime))
        services["jupyter"] = f"real Jupyter Server on 127.0.0.1:{jup.port}"
    return env


def start_container(stack: contextlib.ExitStack, vs: str | None) -> tuple[str | None, str]:
    """A container of the test image, GPU layer off, after its first passing readiness; or why not."""
    def docker(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)

    if not shutil.which("docker"):
        return None, "no docker CLI"
    name = f"healthcheck-bench-{os.getpid()}"
    try:
        if docker("info", timeout=15).returncode:
            return None, "no Docker engine answers (tests/e2e/engine.sh starts one)"
        if docker("image", "inspect", IMAGE, timeout=15).returncode:
            return None, f"no image {IMAGE} (make e2e builds it; E2E_IMAGE names another)"
        stack.callback(docker, "rm", "-f", name)
        run = docker("run", "-d", "--name", name, "--no-healthcheck", "-e", "ENABLE_GPU_CHECK=false",
                     "-e", "HEALTHCHECK_TORCH_DEVICE=cpu", IMAGE)
        if run.returncode:
            return None, f"docker run failed: {' '.join(run.stderr.split())[:200]}"
        end = time.monotonic() + READY_WAIT
        while docker("exec", name, "healthcheck", "--profile", "readiness").returncode:
            if time.monotonic() > end:
                return None, f"readiness did not pass within {READY_WAIT:g} s in {IMAGE}"
            time.sleep(2)
        if vs:  # its front door and source tree, and a copy of the image's suite venv that imports them
            site = f"{BASELINE}/.venv/lib/python3*/site-packages"
            docker("exec", name, "sh", "-c", f"mkdir {BASELINE} && cp -a /opt/healthcheck/.venv {BASELINE}")
            for part in ("probes", "healthcheck"):
                docker("cp", str(Path(vs, part).resolve()), f"{name}:{BASELINE}/{part}")
            docker("exec", name, "sh", "-c", f"cd {site} && rm -r probes && ln -s {BASELINE}/probes probes")
    except subprocess.TimeoutExpired:
        return None, "the Docker engine did not answer in time"
    return name, IMAGE


def reader(name: str, argv: list[str], without: list[str], env: dict[str, str], **kw: Any) -> list[Case]:
    """A notice's reader and the same start without it, measured against each other."""
    other = Case(f"{name}: without the reader", without, env, kind="notice", **kw)
    return [Case(f"{name}: with the reader", argv, env, kind="notice", pair=other, **kw), other]


def notice_cases(env: dict[str, str], py: str, work: Path, readiness: Case) -> list[Case]:
    (work / "run").mkdir()
    person = {"PATH": "/usr/bin:/bin", "HOME": str(work), "IPYTHONDIR": str(work / "ipython")}
    off = {**env, "HEALTHCHECK_NOTICES": "false"}
    cases = [Case("readiness (torch cached), notices off", readiness.argv, off, pair=readiness)]
    for state, text in NOTICES.items():
        (work / "run" / state).write_text(text.format(now=int(time.time())))
        bash = ["bash", "--noprofile", "--norc", "-i", "-c"]
        cases += reader(f"login, {state}", [*bash, f". {ROOT}/docker/gpu-health-notice.sh"], [*bash, ":"],
                        {**person, "HEALTHCHECK_NOTICE_FILE": str(work / "run" / state)})
    person["HEALTHCHECK_NOTICE_FILE"] = str(work / "run" / "unhealthy")
    kernel = [py, "-c", KERNEL]
    return [*cases, *reader("kernel", [*kernel, "with", str(ROOT / "docker")], [*kernel, "without"], person,
                            own_cpu=True)]


def make_cases(args: argparse.Namespace, env: dict[str, str], py: str, work: Path,
               container: str | None) -> list[Case]:
    hc = str(ROOT / "healthcheck")
    cases = [Case(FLOOR, [py, "-c", "pass"], env, kind="floor"),
             Case("floor: python -c 'import torch'", [py, "-c", "import torch"], env, kind="floor"),
             Case("liveness", [hc, "--profile", "liveness"], env),
             Case("readiness (torch cached)", [hc, "--profile", "readiness"], env)]
    if args.vs:
        base = Path(args.vs).resolve()
        twin = {**env, "HEALTHCHECK_PYTHON": str(base / ".venv" / "bin" / "python"),
                "HEALTHCHECK_STATE_DIR": str(work / "state-baseline")}
        for c in [c for c in cases if c.name in PAIRED]:
            c.pair = Case(f"{c.name} @ baseline", [str(base / "healthcheck"), *c.argv[1:]], twin,
                          kind="baseline")
            cases.append(c.pair)
    if container:
        argv = ["docker", "exec", container]
        cases += [Case(DOCKER_FLOOR, [*argv, "true"], dict(os.environ), DOCKER_FLOOR, "floor", own=False)]
        cases += [Case(f"docker exec: {c.name}", [*argv, "healthcheck", *c.argv[1:]], dict(os.environ),
                       DOCKER_FLOOR, "docker exec", own=False) for c in cases if c.name in PAIRED]
        if args.vs:  # the baseline's, copied into the same container by start_container
            twin = [*argv[:2], "-e", "HEALTHCHECK_STATE_DIR=/run/healthcheck-baseline", container,
                    f"{BASELINE}/healthcheck"]
            for c in [c for c in cases if c.kind == "docker exec"]:
                c.pair = Case(f"{c.name} @ baseline", [*twin, *c.argv[4:]], dict(os.environ), DOCKER_FLOOR,
                              "baseline", own=False)
                cases.append(c.pair)
    cases += notice_cases(env, py, work, cases[3])
    # Last in a round, so that what a kernel start and a torch worker leave behind (page cache,
    # exiting processes) falls between no floor and its cases and between no pair.
    cases.append(Case("startup (torch fresh)", [hc, "--profile", "startup"], env))
    if args.cases:
        wanted = [w.strip() for w in args.cases.split(",")]
        keep = [c for c in cases if c.kind == "floor" or any(w in c.name for w in wanted)]
        cases = [c for c in cases if c in keep or any(k.pair is c for k in keep)]
    return cases


def paired(c: Case) -> dict[str, dict[str, float]]:
    """Against its pair, round by round: the median ratio, the median and p90 difference (ms)."""
    out = {}
    for i, k in enumerate(("wall", "cpu")[:2 if c.own else 1]):
        a, b = ([s[i] for s in x.samples] for x in (c, c.pair))
        diff = sorted(x - y for x, y in zip(a, b))
        out[k] = {"ratio": statistics.median([x / y for x, y in zip(a, b) if y > 0]),
                  "diff_ms": statistics.median(diff), "diff_p90_ms": diff[round(0.9 * (len(diff) - 1))]}
    return out


def record(c: Case) -> dict[str, Any]:
    wall, cpu, rss = [s[0] for s in c.samples], [s[1] for s in c.samples], [s[2] for s in c.samples]
    bad = [s for s in c.samples if s[3] != 0]
    probes: dict[str, list[float]] = {}  # from the report's `STATUS name 0.123s message` lines
    for parts in (line.split() for s in c.samples for line in s[4].splitlines()[1:]):
        if len(parts) >= 3 and parts[2].endswith("s"):
            with contextlib.suppress(ValueError):
                probes.setdefault(parts[1], []).append(float(parts[2][:-1]) * 1000)
    return {"kind": c.kind, "argv": [a.replace(f"{ROOT}/", "") for a in c.argv], "runs": len(c.samples),
            "wall_ms": [round(x, 2) for x in wall], "cpu_ms": [round(x, 2) for x in cpu],
            "rss_mib": [round(x, 2) for x in rss], "exit_codes": sorted({s[3] for s in c.samples}),
            "failures": len(bad), "first_failure": (bad[0][4].splitlines() or [""])[0] if bad else None,
            "probe_ms": probes, "sample_output": c.samples[-1][4][:1000],
            "summary": {"wall_ms_median": statistics.median(wall), "cpu_ms_median": statistics.median(cpu),
                        "rss_mib_max": max(rss)},
            **({"against": c.pair.name, "paired": paired(c)} if c.pair else {})}


def report(cases: list[Case], results: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    med = {name: float(r["summary"]["wall_ms_median"]) for name, r in results.items()}
    head = f"{'case':<40}{'wall med':>9}{'max':>8}{'cpu med':>9}{'rss max':>9}{'x floor':>9}  exit"
    lines = [head, "-" * len(head)]
    for c in cases:
        r, s = results[c.name], results[c.name]["summary"]
        lines.append(f"{c.name:<40}{s['wall_ms_median']:9.1f}{max(r['wall_ms']):8.1f}"
                     + (f"{s['cpu_ms_median']:9.1f}{s['rss_mib_max']:9.1f}" if c.own else f"{'-':>9}{'-':>9}")
                     + f"{s['wall_ms_median'] / med[c.floor]:8.2f}x  {','.join(map(str, r['exit_codes']))}")
    lines.append("(ms; cpu: user+sys of the process tree; rss: MiB, the largest process in the tree)")
    lines += [f"  ! {c.name}: {results[c.name]['failures']}/{len(c.samples)} runs failed: "
              f"{results[c.name]['first_failure']}" for c in cases if results[c.name]["failures"]]
    lines += ["", "each probe's own elapsed time, median ms (from the report lines):"]
    lines += [f"  {c.name}: " + ", ".join(f"{p} {statistics.median(t):.0f}" for p, t in
                                          results[c.name]["probe_ms"].items())
              for c in cases if results[c.name]["probe_ms"]]
    lines += ["", "paired, round by round: median difference (p90), median ratio:"]
    lines += [f"  {c.name} - {c.pair.name}: " + "; ".join(
        f"{k} {m['diff_ms']:+.1f} ms ({m['diff_p90_ms']:+.1f}), {m['ratio']:.3f}x"
        for k, m in results[c.name]["paired"].items()) for c in cases if c.pair]

    targets = []
    for c in cases:
        r, ok = results[c.name], not results[c.name]["failures"]
        if c.name in FACTORS:
            m, f = med[c.name], med[c.floor]
            targets.append((f"{c.name} median <= {FACTORS[c.name]:g}x its floor",
                            ok and m <= FACTORS[c.name] * f,
                            f"{m:.1f} ms, {m / f:.2f}x {f:.1f} ms ({c.floor})"))
        if c.name == "liveness":
            rss = r["summary"]["rss_mib_max"]
            targets.append((f"liveness peak RSS < {LIVENESS_RSS_MIB:g} MiB", rss < LIVENESS_RSS_MIB,
                            f"max {rss:.1f} MiB"))
        cpu = r.get("paired", {}).get("cpu", {})
        if c.pair and c.pair.kind == "baseline":  # what is paired: wall and CPU; through docker exec, wall
            ratios = {k: m["ratio"] for k, m in r["paired"].items()}
            said = ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()) + f" ({len(c.samples)} pairs)"
            targets.append((f"{c.name} within {BASELINE_SLACK:.0%} of the baseline (median per-round ratio)",
                            ok and max(ratios.values()) <= 1 + BASELINE_SLACK, said))
        elif c.pair and c.kind == "notice" and c.own:
            targets.append((f"{c.name}: at most {NOTICE_MS:g} ms of CPU over {c.pair.name!r}",
                            ok and cpu["diff_ms"] <= NOTICE_MS,
                            f"{cpu['diff_ms']:+.1f} ms (median of {len(r['cpu_ms'])} pairs)"))
    lines += ["", "targets:"] + [f"  {'MET    ' if met else 'NOT MET'}  {what}: {detail}"
                                 for what, met, detail in targets]
    return lines, [{"target": what, "met": met, "detail": detail} for what, met, detail in targets]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="rounds: samples per case (default 20)")
    p.add_argument("--cases", help="only the cases whose names contain one of these (comma-separated); "
                   "their pairs and the floors run too")
    p.add_argument("--vs", metavar="DIR", help="a baseline checkout with its own .venv: liveness and cached "
                   "readiness run through its front door too, paired round by round")
    p.add_argument("--no-docker", action="store_true", help="skip the docker exec cases")
    try:
        args = p.parse_args(argv)
        if args.runs < 1:
            p.error("--runs must be at least 1")
        if not FAKE_NVML.exists():
            p.error(f"no {FAKE_NVML.relative_to(ROOT)}: run make setup (or make fakes)")
        if args.vs and not (Path(args.vs) / ".venv" / "bin" / "python").exists():
            p.error(f"--vs {args.vs}: not a checkout with its own .venv (run make install there)")
        if not (cc := shutil.which("cc") or shutil.which("gcc")):
            p.error("no C compiler (cc or gcc) on PATH: apt-get install -y gcc")
    except SystemExit as exc:
        return 0 if exc.code == 0 else 3  # argparse's 2 is a usage error
    py = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
    started = datetime.datetime.now(datetime.timezone.utc)
    services: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hcbench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        (work / "bin").mkdir()
        for name in ("spawn", "nvidia-smi"):  # the launcher, and the nvidia-smi on PATH
            subprocess.run([cc, "-O2", "-o", str(work / "bin" / name), str(ROOT / "bench" / f"{name}.c")],
                           check=True)
        launcher = str(work / "bin" / "spawn")
        env = host_env(work, py, stack, services)
        container, docker = (None, "--no-docker") if args.no_docker else start_container(stack, args.vs)
        cases = make_cases(args, env, py, work, container)
        load = [os.getloadavg()[0]]
        swapped = list(cases)  # every other round's order: each case and its pair change places
        for c in (c for c in cases if c.pair in swapped):
            i, j = swapped.index(c), swapped.index(c.pair)
            swapped[i], swapped[j] = swapped[j], swapped[i]
        for c in cases:  # warm the page cache and the result caches: not measured
            measure(launcher, c)
        for i in range(args.runs):
            for c in swapped if i % 2 else cases:
                c.samples.append(measure(launcher, c))
        load.append(os.getloadavg()[0])

    results = {c.name: record(c) for c in cases}
    lines, targets = report(cases, results)
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip() or None
    dirty = bool(subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, check=False).stdout.strip())
    header = [f"healthcheck bench  {started:%Y-%m-%d %H:%M:%S}Z  commit {(commit or '?')[:12]}"
              f"{' (dirty)' if dirty else ''}  python {platform.python_version()}  {os.cpu_count()} cores  "
              f"load {load[0]:.2f}->{load[1]:.2f}",
              "gpu: faked: bench/nvidia-smi.c on PATH, tests/fakes' NVML (1 GPU); torch on the CPU",
              f"services: {'; '.join(services.values())}",
              f"docker exec: {docker}, ENABLE_GPU_CHECK=false HEALTHCHECK_TORCH_DEVICE=cpu" if container
              else f"docker exec: skipped: {docker}",
              f"runs: {args.runs} rounds, each case once a round; measured by bench/spawn.c (wait4)", ""]
    doc = {"time": started.isoformat(timespec="seconds"), "commit": commit, "dirty": dirty,
           "python": platform.python_version(), "platform": platform.platform(), "cores": os.cpu_count(),
           "loadavg": {"before": load[0], "after": load[1]}, "services": services, "runs": args.runs,
           "cases": results, "docker_exec": {"image": docker} if container else {"skipped": docker},
           "targets": targets}
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    (RESULTS / f"{started:%Y%m%dT%H%M%SZ}.json").write_text(text)
    (RESULTS / "latest.json").write_text(text)
    print("\n".join([*header, *lines, "", f"results: bench/results/{started:%Y%m%dT%H%M%SZ}.json, latest"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
