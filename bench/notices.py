"""What the notices' readers cost the person (docs/benchmark.md, "Notices"): paired runs, round by
round in alternating order, of

  login    an interactive bash that sources docker/gpu-health-notice.sh, as /etc/profile does,
           against one that does not; the notice unhealthy (the reader stats and reads it and
           prints two lines) and healthy (it stats and reads it);
  kernel   what the hook adds to a kernel's start, in a fresh interpreter with IPython's shell
           made: the configuration read, its start line run and the first cell (which shows the
           notice), against the first cell alone;
  server   for scale, a kernel started through a real Jupyter Server and its first cell run to
           its reply, with the test's copy of docker/ipython_kernel_config.py and without it;
  check    what telling costs a readiness run (`python -m probes`, the hardware layer on the stub
           nvidia-smi and the fake NVML): the lock, the record and the published notice, against
           HEALTHCHECK_NOTICES=false.

Each is timed by the wall clock and by CPU time (the processes' user + system time, which other
work on the machine blurs far less). Usage: bench/notices.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.servers and tests.notice_kernel

from tests.fakes.nvidia_smi_stub import write_stub  # noqa: E402
from tests.notice_kernel import run_cells  # noqa: E402
from tests.servers import Jupyter  # noqa: E402

TOKEN = "bench-notices"
LOGIN = ROOT / "docker" / "gpu-health-notice.sh"
CONFIG = ROOT / "docker" / "ipython_kernel_config.py"
# One kernel's start as IPython runs it, the shell already made: with the configuration, then the
# first cell. Prints its CPU milliseconds; the notice goes to stderr (discarded).
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
Run = Callable[[], "float | None"]  # runs once; returns its own CPU milliseconds, or None: its children's


def timed(fn: Run) -> tuple[float, float]:
    """(wall, CPU) milliseconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    own = fn()
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    return wall, cpu if own is None else own


def paired(runs: int, with_: Run, without: Run) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    pairs = []
    for i in range(runs):
        if i % 2:
            b = timed(without)
            a = timed(with_)
        else:
            a = timed(with_)
            b = timed(without)
        pairs.append((a, b))
    return pairs


def report(name: str, pairs: list[tuple[tuple[float, float], tuple[float, float]]],
           measures: tuple[str, ...] = ("wall", "cpu")) -> dict[str, float]:
    row: dict[str, float] = {"pairs": len(pairs)}
    for i, what in enumerate(("wall", "cpu")):
        if what not in measures:
            continue
        diffs = sorted(a[i] - b[i] for a, b in pairs)
        row.update({f"{what}_with_ms": statistics.median(a[i] for a, _ in pairs),
                    f"{what}_without_ms": statistics.median(b[i] for _, b in pairs),
                    f"{what}_diff_median_ms": statistics.median(diffs),
                    f"{what}_diff_p90_ms": diffs[int(0.9 * (len(diffs) - 1))]})
        print(f"{name:15} {what:4} with {row[f'{what}_with_ms']:7.1f} ms, without "
              f"{row[f'{what}_without_ms']:7.1f} ms; paired difference: median "
              f"{row[f'{what}_diff_median_ms']:+.1f} ms, p90 {row[f'{what}_diff_p90_ms']:+.1f} ms")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="pairs of kernel starts (logins: 5x as many)")
    args = ap.parse_args()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"{5 * args.runs} pairs of logins, {args.runs} of kernels; load average {load}")
    root = Path(tempfile.mkdtemp(prefix="bench-notices-"))
    (root / "run").mkdir()
    now = int(time.time())
    unhealthy, healthy = root / "run" / "unhealthy", root / "run" / "healthy"
    unhealthy.write_text(f"{now} 86400 unhealthy 10:42 UTC\nunhealthy since 10:40 UTC: nvml: GPU 0 is lost\n"
                         "not fixable from inside this container; your platform's operator is alerted if "
                         "alerting is set up\n")
    healthy.write_text(f"{now} 86400 healthy 10:42 UTC\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "IPYTHONDIR": str(root / "ipython")}

    def shell(command: str, notice: Path) -> Run:
        argv = ["bash", "--noprofile", "--norc", "-i", "-c", command]
        return lambda: subprocess.run(argv, env={**env, "HEALTHCHECK_NOTICE_FILE": str(notice)},
                                      stdin=subprocess.DEVNULL, capture_output=True, check=True) and None

    def kernel(mode: str) -> Run:
        argv = [sys.executable, "-c", KERNEL, mode, str(CONFIG.parent)]
        return lambda: float(subprocess.run(argv, env={**env, "HEALTHCHECK_NOTICE_FILE": str(unhealthy)},
                                            capture_output=True, text=True, check=True).stdout)

    results = {f"login {state}": report(f"login {state}", paired(5 * args.runs, shell(f". {LOGIN}", notice),
                                                                 shell(":", notice)))
               for state, notice in (("unhealthy", unhealthy), ("healthy", healthy))}
    # The interpreter's own start is alike in both: CPU time of the measured part only.
    results["kernel"] = report("kernel", paired(args.runs, kernel("with"), kernel("without")), ("cpu",))
    write_stub(root / "bin", "ok", gpus=1)
    (root / "scenario").write_text("gpus 1\n")

    def check(on: bool) -> Run:
        off = {t: "false" for t in ("ENABLE_JUPYTER_CHECK", "ENABLE_SSH_CHECK", "ENABLE_TORCH_CHECK")}
        run_env = {**env, **off, "PATH": f"{root / 'bin'}:/usr/bin:/bin",
                   "HEALTHCHECK_STATE_DIR": str(root / "state"), "HEALTHCHECK_CHECKS_DIR": str(root / "none"),
                   "LD_LIBRARY_PATH": str(ROOT / "tests" / "fakes" / "build"),
                   "FAKE_NVML_SCENARIO": str(root / "scenario"), "HEALTHCHECK_NOTICES": str(on).lower(),
                   "HEALTHCHECK_NOTICE_FILE": str(root / "run" / "n"), "_HEALTHCHECK_NOTICE_LOG": "/dev/null"}
        return lambda: subprocess.run([sys.executable, "-m", "probes"], env=run_env, cwd=ROOT,
                                      capture_output=True, check=True) and None

    results["check"] = report("check", paired(args.runs, check(True), check(False)))
    (root / "jupyter").mkdir()
    server = Jupyter(root / "jupyter", token=TOKEN)
    try:
        for name, config in (("notice", True), ("plain", False)):
            ipython = root / f"ipython-{name}" / "profile_default"
            ipython.mkdir(parents=True)
            if config:
                shutil.copy2(CONFIG, ipython / "ipython_kernel_config.py")
            spec = server.root / "data" / "kernels" / name
            spec.mkdir(parents=True)
            (spec / "kernel.json").write_text(json.dumps({
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": name, "language": "python",
                "env": {"IPYTHONDIR": str(ipython.parent), "HEALTHCHECK_NOTICE_FILE": str(unhealthy)}}))
        base = f"http://127.0.0.1:{server.port}/"
        shown = run_cells(base, TOKEN, "notice", [("1", True)])[0]["stderr"]
        assert shown.startswith("gpu-health: "), shown

        def start(name: str) -> Run:
            return lambda: run_cells(base, TOKEN, name, [("1", True)]) and None

        # The kernel is the server's child, not ours: wall time only.
        results["server"] = report("server", paired(args.runs, start("notice"), start("plain")), ("wall",))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
