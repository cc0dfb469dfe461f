"""The checks of `make gpu-verify` (started by tests/gpu/verify.sh; its header is the help).

    python tests/gpu/verify.py --out DIR --work DIR --suite-python PY --torch-python PY \
        [--install FILE] [--fake]

Every check runs on its own: a failure (or a bug here) is recorded as FAIL with the reason
and the next check runs. result.json and summary.md in --out are rewritten after every
check, so even a run cut short leaves a summary; logs/ beside them keeps each command's
output. Exit status 0 when no check failed, 1 otherwise.

Processes started here carry GPU_VERIFY_MARK=<run id> in their environment (children
inherit it), which is how "nothing is left behind" is checked. Loopback only: the one
server talked to is the `healthcheck serve` started here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import platform
import re
import selectors
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "gpu"
FRONT_DOOR = str(ROOT / "healthcheck")
FAULT_PYTHON = str(HERE / "fault-python.sh")
MIN_FREE_MIB = 1024  # HEALTHCHECK_TORCH_MIN_FREE_MIB's default (probes/framework/torch_cuda.py)
NCCL_MIB = 256  # what the suite adds for NCCL's buffers (probes/framework/room.py)
LOOPBACK = "127.0.0.1"
NEEDS_GPU = "skipped: needs a real GPU"
# The probe's own query (probes/hardware/nvidia_smi.py): read-only.
SMI_QUERY = ("nvidia-smi", "--query-gpu=index,name,uuid", "--format=csv,noheader,nounits")
NVML_INIT = ("import time, pynvml\nt = time.perf_counter()\npynvml.nvmlInit()\n"
             "print(time.perf_counter() - t)\npynvml.nvmlShutdown()\n")
TORCH_FACTS = ("import json, torch\nok = torch.cuda.is_available()\n"
               "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'available': ok,\n"
               "  'devices': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if ok else []}))\n")
PASS, FAIL, SKIPPED = "PASS", "FAIL", "SKIPPED"
STEPS = {
    0: "install and first CUDA context",
    1: "gpu-marked tests (pytest -m gpu)",
    2: "healthcheck in every profile, text and --json",
    3: "real CUDA faults",
    4: "healthcheck serve with the NVML event watch",
    5: "timings",
}


class Fail(Exception):
    """A check's failure: the message is the reason shown."""


def says_latched(body: str) -> bool:
    """Whether a /livez body says latched (its latch:state check fails)."""
    try:
        entries = json.loads(body).get("checks", {}).get("latch:state") or [{}]
    except (ValueError, AttributeError):
        return False
    return entries[0].get("status") == "fail"


def expect(ok: object, why: str) -> None:
    if not ok:
        raise Fail(why)


class Ran(NamedTuple):
    rc: int | None  # None: timed out or could not start
    out: str
    err: str
    wall: float
    report: dict[str, Any] | None  # the parsed --json report

    def check(self, probe: str) -> dict[str, Any]:
        """The report's entry for one probe (raises Fail when it is missing)."""
        for key, entries in (self.report or {}).get("checks", {}).items():
            if key.split(":", 1)[0] == probe and entries:
                return dict(entries[0])
        raise Fail(f"no {probe} check in the report (exit {self.rc}): {self.first_line()}")

    def first_line(self) -> str:
        text = (self.out or self.err).strip()
        return text.splitlines()[0][:300] if text else "(no output)"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Verify:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.fake = bool(args.fake)
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.suite_py = args.suite_python
        self.torch_py = args.torch_python
        self.mark = uuid.uuid4().hex[:16]
        self.started = time.monotonic()
        self.budget = float(os.environ.get("GPU_VERIFY_BUDGET") or 420)
        self.runs = int(os.environ.get("GPU_VERIFY_RUNS") or (3 if self.fake else 5))
        self.checks: list[dict[str, Any]] = []
        self.timings: dict[str, dict[str, Any]] = {}
        self.info: dict[str, Any] = {}
        self.seq = 0
        self.step = 0
        self.env = self._base_env()

    # -- environment ---------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        drop = ("ENABLE_", "HEALTHCHECK_", "GPU_VERIFY_", "FAKE_NVML")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env.update(ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false", HEALTHCHECK_PYTHON=self.suite_py,
                   HEALTHCHECK_TORCH_PYTHON=self.torch_py, HEALTHCHECK_TORCH_DEVICE="cpu" if self.fake else "cuda",
                   HEALTHCHECK_FASTPATH="false", GPU_VERIFY_MARK=self.mark)
        log_file = self.logs / "healthcheck.log"
        if " " not in str(log_file):  # the suite takes a path without spaces
            env["HEALTHCHECK_LOG_FILE"] = str(log_file)
        if self.fake:
            for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
                env.pop(var, None)
            bin_dir, scenario = self._fakes()
            env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
            lib = str(ROOT / "tests" / "fakes" / "build")
            env["LD_LIBRARY_PATH"] = f"{lib}{os.pathsep}{env['LD_LIBRARY_PATH']}" if env.get(
                "LD_LIBRARY_PATH") else lib
            env["FAKE_NVML_SCENARIO"] = str(scenario)
        return env

    def _fakes(self) -> tuple[Path, Path]:
        """A stub nvidia-smi (one healthy GPU) and a fake NVML scenario of one healthy GPU."""
        sys.path.insert(0, str(ROOT))
        from tests.fakes.nvidia_smi_stub import write_stub

        bin_dir = self.work / "bin"
        write_stub(bin_dir, "ok", gpus=1, name="NVIDIA H100 80GB HBM3")
        scenario = self.work / "scenario.txt"
        scenario.write_text("# one healthy GPU\ngpus 1\n")
        return bin_dir, scenario

    def with_env(self, **extra: str | None) -> dict[str, str]:
        env = dict(self.env)
        for key, value in extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def new_state(self) -> str:
        return tempfile.mkdtemp(prefix="state-", dir=self.work)

    # -- running things ------------------------------------------------------------------

    def log(self, name: str, text: str) -> Path:
        self.seq += 1
        safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:60]
        path = self.logs / f"{self.seq:03d}-{safe}.log"
        path.write_text(text, encoding="utf-8", errors="replace")
        return path

    def run(self, argv: list[str], name: str, env: dict[str, str] | None = None, timeout: float = 180,
            parse: bool = False) -> Ran:
        """Run a command in its own session; at the timeout the whole group is killed."""
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env or self.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            self.log(name, f"$ {shlex.join(argv)}\ncannot start: {exc}\n")
            return Ran(None, "", f"cannot start: {exc}", 0.0, None)
        try:
            out_b, err_b = proc.communicate(timeout=timeout)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            out_b, err_b = proc.communicate()
            rc = None
            err_b += f"\n[gpu-verify: killed after {timeout:g} s]".encode()
        wall = time.perf_counter() - start
        out, err = out_b.decode("utf-8", "replace"), err_b.decode("utf-8", "replace")
        self.log(name, f"$ {shlex.join(argv)}\nexit {rc} after {wall:.3f} s\n--- stdout\n{out}\n--- stderr\n{err}")
        report = None
        if parse:
            with contextlib.suppress(ValueError):
                loaded = json.loads(out)
                report = loaded if isinstance(loaded, dict) else None
        return Ran(rc, out, err, wall, report)

    def hc(self, *args: str, name: str, env: dict[str, str] | None = None, timeout: float = 180) -> Ran:
        """One run of the front door, as Docker and the kubelet run it."""
        return self.run([FRONT_DOOR, *args], name, env=env, timeout=timeout, parse="--json" in args)

    def marked(self, mark: str | None = None) -> list[int]:
        """Live processes (not zombies) whose environment carries our run marker."""
        needle = f"GPU_VERIFY_MARK={mark or self.mark}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    environ = fh.read().split(b"\0")
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if needle in environ and stat[stat.rfind(b")") + 2:][:1] != b"Z":
                found.append(int(entry))
        return found

    def wait_gone(self, timeout: float = 10.0, mark: str | None = None) -> tuple[list[int], float]:
        """Wait until no marked process is left; (those still there, seconds waited)."""
        start = time.monotonic()
        left = self.marked(mark)
        while left and time.monotonic() - start < timeout:
            time.sleep(0.1)
            left = self.marked(mark)
        return left, time.monotonic() - start

    def no_leftovers(self, what: str) -> str:
        left, waited = self.wait_gone()
        if left:
            names = []
            for pid in left[:5]:
                try:
                    names.append(f"{pid} ({Path(f'/proc/{pid}/cmdline').read_bytes()[:80]!r})")
                except OSError:
                    names.append(str(pid))
            for pid in left:  # do not let them spoil the next checks
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            raise Fail(f"{len(left)} process(es) left behind after {what}: {', '.join(names)}")
        return f"nothing left behind ({waited:.1f} s)" if waited >= 0.1 else "nothing left behind"

    # -- checks and results ----------------------------------------------------------------

    def begin(self, step: int) -> None:
        self.step = step
        print(f"\n== step {step}: {STEPS[step]}", flush=True)

    def record(self, name: str, status: str, detail: str, seconds: float = 0.0) -> None:
        detail = " ".join(detail.split())[:600]
        self.checks.append({"step": self.step, "check": name, "status": status, "detail": detail,
                            "seconds": round(seconds, 2)})
        print(f"{status:<8}[{self.step}] {name}: {detail} ({seconds:.1f} s)", flush=True)
        self.save()

    def check(self, name: str, fn: Callable[[], str], *, needs_gpu: bool = False) -> bool:
        if needs_gpu and self.fake:
            self.record(name, SKIPPED, NEEDS_GPU)
            return False
        spent = time.monotonic() - self.started
        if spent > self.budget:
            self.record(name, SKIPPED, f"skipped: out of time ({spent:.0f} s > GPU_VERIFY_BUDGET={self.budget:g})")
            return False
        start = time.monotonic()
        try:
            detail, status = fn(), PASS
        except Fail as exc:
            detail, status = str(exc), FAIL
        except Exception as exc:
            detail, status = f"the check itself failed: {type(exc).__name__}: {exc}", FAIL
            self.log(f"internal-{name}", traceback.format_exc())
        self.record(name, status, detail, time.monotonic() - start)
        return status == PASS

    def timing(self, key: str, what: str, runs: list[float], **extra: Any) -> dict[str, Any]:
        entry = {"what": what, "runs_s": [round(r, 4) for r in runs], "median_s": round(median(runs), 4),
                 "min_s": round(min(runs), 4) if runs else None, "max_s": round(max(runs), 4) if runs else None,
                 **extra}
        self.timings[key] = entry
        self.save()
        return entry

    def x_floor(self) -> None:
        """Each timing against the python floor, once the floor is known."""
        floor = self.timings.get("floor", {}).get("median_s")
        for key, entry in self.timings.items():
            if floor and key != "floor" and key != "nvml_init":  # nvml_init is in-process
                entry["x_floor"] = round(entry["median_s"] / floor, 1)

    def verdict(self) -> str:
        counts = {s: sum(c["status"] == s for c in self.checks) for s in (PASS, FAIL, SKIPPED)}
        word = FAIL if counts[FAIL] else PASS
        return f"{word} ({counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped)"

    def save(self) -> None:
        self.x_floor()
        result = {"mode": "fake" if self.fake else "gpu", "verdict": self.verdict(), "info": self.info,
                  "checks": self.checks, "timings": self.timings,
                  "elapsed_s": round(time.monotonic() - self.started, 1)}
        tmp = self.out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.out / "result.json")
        tmp = self.out / "summary.md.tmp"
        tmp.write_text(self.markdown())
        tmp.replace(self.out / "summary.md")

    def markdown(self) -> str:
        i = self.info
        gpu = i.get("gpu", "?")
        lines = [f"# gpu-verify: {self.verdict()}", ""]
        if self.fake:
            lines += ["FAKE self-test: fake libnvidia-ml.so.1 and a stub nvidia-smi (one healthy GPU), torch on "
                      "the CPU. It proves the script, not a GPU; every check that needs real CUDA is skipped.", ""]
        lines += [
            "| GPU | driver | CUDA (driver) | CUDA (torch) | torch | python | date | commit |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {gpu} | {i.get('driver', '?')} | {i.get('cuda_driver', '?')} | {i.get('torch_cuda', '?')} | "
            f"{i.get('torch', '?')} | {i.get('python', '?')} | {i.get('date', '?')} | {i.get('commit', '?')} |",
            "",
            "docs/gpu-verify.md row (Verified on):",
            "",
            f"    | {gpu} | {i.get('driver', '?')} | {i.get('torch_cuda', '?')} | {i.get('torch', '?')} | "
            f"{str(i.get('date', '?'))[:10]} | {self.verdict().split(' (')[0]} |",
            "",
            "## Checks",
            "",
            "| step | check | result | detail | s |",
            "| --- | --- | --- | --- | --- |",
        ]
        for c in self.checks:
            detail = c["detail"].replace("|", "\\|")
            lines.append(f"| {c['step']} | {c['check']} | {c['status']} | {detail} | {c['seconds']} |")
        lines += ["", "## Timings (seconds, wall time of a whole process unless noted)", "",
                  "| what | median | min | max | x floor | runs |", "| --- | --- | --- | --- | --- | --- |"]
        for t in self.timings.values():
            lines.append(f"| {t['what']} | {t['median_s']} | {t['min_s']} | {t['max_s']} | "
                         f"{t.get('x_floor', '')} | {len(t['runs_s'])} |")
        lines += ["", f"Logs: logs/ beside this file. Run took {time.monotonic() - self.started:.0f} s.", ""]
        return "\n".join(lines)

    # -- step 0 ----------------------------------------------------------------------------

    def gather_info(self) -> None:
        i = self.info
        i["mode"] = "FAKE (fake NVML, stub nvidia-smi, CPU torch)" if self.fake else "real GPU"
        i["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        i["python"] = platform.python_version()
        i["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
        i["suite_python"], i["torch_python"] = self.suite_py, self.torch_py
        ran = self.run(["git", "rev-parse", "--short=12", "HEAD"], "git-commit", timeout=10)
        # A copy of the tree without .git can be told its commit: GPU_VERIFY_COMMIT.
        i["commit"] = (os.environ.get("GPU_VERIFY_COMMIT") or (ran.out.strip() if ran.rc == 0 else "")
                       or "unknown")
        ran = self.run([self.suite_py, "-m", "tests.gpu.nvml_fields"], "nvml-info", timeout=60, parse=True)
        nv = ran.report or {}
        if "driver" in nv:
            names = [g.get("nvmlDeviceGetName") for g in nv.get("gpus", []) if "index" in g]
            i["gpu"] = f"{names[0]} x{len(names)}" if names and len(set(names)) == 1 else ", ".join(map(str, names))
            i["driver"], i["cuda_driver"], i["gpu_count"] = nv["driver"], nv.get("cuda_driver") or "n/a", nv["count"]
        else:
            i["gpu"] = f"unknown (NVML: {nv.get('error') or ran.first_line()})"
        ran = self.run([self.torch_py, "-c", TORCH_FACTS], "torch-info", timeout=120, parse=True)
        t = ran.report or {}
        i["torch"] = t.get("torch", f"unknown ({ran.first_line()})")
        i["torch_cuda"] = t.get("cuda") or "none (CPU build)"
        i["torch_sees"] = t.get("devices", [])
        if self.fake:
            i["gpu"] = f"{i.get('gpu')} (fake)"
        self.save()

    def step0(self) -> None:
        self.begin(0)
        try:
            install = json.loads(Path(self.args.install).read_text()) if self.args.install else {}
        except (OSError, ValueError) as exc:
            install = {"status": FAIL, "detail": f"no install result ({exc})"}
        status = install.get("status", FAIL)
        self.record("install the suite into a --system-site-packages venv, offline",
                    status if status in (PASS, FAIL) else FAIL, install.get("detail", "?"),
                    float(install.get("seconds", 0)))
        self.gather_info()
        print(f"GPU {self.info.get('gpu')}, driver {self.info.get('driver', '?')}, CUDA "
              f"{self.info.get('cuda_driver', '?')}, torch {self.info.get('torch')} (CUDA "
              f"{self.info.get('torch_cuda')})", flush=True)
        self.check("first CUDA context: startup --only torch-cuda, fresh state dir", self.cold_run)

    def cold_run(self) -> str:
        ran = self.hc("--profile", "startup", "--only", "torch-cuda", "--json", name="cold-torch-cuda",
                      env=self.with_env(HEALTHCHECK_STATE_DIR=self.new_state()))
        torch = ran.check("torch-cuda")
        self.timing("torch_cold", "torch-cuda cold: the session's first CUDA context (startup --only "
                    "torch-cuda, fresh state dir)", [ran.wall], probe_s=torch.get("elapsed"))
        expect(ran.rc == 0 and torch.get("status") == "pass",
               f"exit {ran.rc}, torch-cuda {torch.get('status')} ({torch.get('reason')}): {torch.get('output')}")
        return f"exit 0 in {ran.wall:.2f} s (probe {torch.get('elapsed')} s): {torch.get('output')}"

    # -- step 1 ----------------------------------------------------------------------------

    def step1(self) -> None:
        self.begin(1)
        self.check("pytest -m gpu", self.gpu_tests)

    def gpu_tests(self) -> str:
        files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                       if "mark.gpu" in p.read_text(encoding="utf-8", errors="replace"))
        expect(files, "no test file under tests/ carries the gpu marker")
        ran = self.run([self.suite_py, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", *files],
                       "pytest-gpu", timeout=300)
        lines = ran.out.splitlines()
        summary = next((ln.strip("= ") for ln in reversed(lines) if re.search(r" in [\d.]+s", ln)),
                       ran.first_line())
        failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        expect(ran.rc == 0, f"exit {ran.rc}: {summary}; {'; '.join(failed[:5])}")
        skipped_ours = [ln for ln in lines if ln.startswith("SKIPPED") and "tests/gpu/" in ln]
        passed = re.search(r"(\d+) passed", summary)
        if not self.fake:
            expect(passed and not skipped_ours,
                   f"{summary}: on a GPU machine the tests in tests/gpu must run: {'; '.join(skipped_ours[:3])}")
        note = " (FAKE: NVML on the fake library; the CUDA tests skip: needs a real GPU)" if self.fake else ""
        return f"{summary} in {', '.join(files)}{note}"

    # -- step 2 ----------------------------------------------------------------------------

    def step2(self) -> None:
        self.begin(2)
        state = self.new_state()
        for profile in ("startup", "readiness", "liveness"):
            for as_json in (True, False):
                name = f"{profile} {'--json' if as_json else 'text'}"
                self.check(f"{name} passes", lambda p=profile, j=as_json: self.profile_run(state, p, j))
        self.check("no process left behind by the runs", lambda: self.no_leftovers("the profile runs"))

    def profile_run(self, state: str, profile: str, as_json: bool) -> str:
        args = ["--profile", profile] + (["--json"] if as_json else [])
        ran = self.hc(*args, name=f"profile-{profile}{'-json' if as_json else ''}",
                      env=self.with_env(HEALTHCHECK_STATE_DIR=state))
        probes = ["torch-cuda"] if profile == "liveness" else ["nvidia-smi", "nvml", "torch-cuda"]
        if not as_json:
            expect(ran.rc == 0 and ran.out.startswith("healthy"), f"exit {ran.rc}: {ran.first_line()}")
            missing = [p for p in probes if not re.search(rf"^(PASS|WARN) {re.escape(p)} ", ran.out, re.M)]
            expect(not missing, f"no PASS/WARN line for {', '.join(missing)}: {ran.first_line()}")
            return f"exit 0 in {ran.wall:.2f} s: {ran.first_line()}"
        expect(ran.report is not None, f"exit {ran.rc}, no JSON report: {ran.first_line()}")
        assert ran.report is not None
        status = ran.report.get("status")
        shown = []
        for p in probes:
            c = ran.check(p)
            expect(c.get("status") in ("pass", "warn") and not c.get("skipped"),
                   f"{p} {c.get('status')} ({c.get('reason')}): {c.get('output')}")
            shown.append(f"{p} {c.get('status')}")
        expect(ran.rc == 0 and status in ("pass", "warn"), f"exit {ran.rc}, status {status}")
        return f"exit 0, status {status} in {ran.wall:.2f} s: {', '.join(shown)}"

    # -- step 3 ----------------------------------------------------------------------------

    def fault_env(self, fault: str, state: str, starts: Path, **extra: str) -> dict[str, str]:
        return self.with_env(HEALTHCHECK_TORCH_PYTHON=FAULT_PYTHON, GPU_VERIFY_FAULT=fault,
                             GPU_VERIFY_TORCH_PYTHON=self.torch_py, GPU_VERIFY_STARTS=str(starts),
                             GPU_VERIFY_SIMULATE="1" if self.fake else "0", HEALTHCHECK_STATE_DIR=state, **extra)

    @staticmethod
    def starts(path: Path) -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    def step3(self) -> None:
        self.begin(3)
        state = self.new_state()
        starts = self.work / "starts-assert.txt"
        how = "simulated on the CPU: the worker raises CUDA's error text" if self.fake else "real"
        self.check(f"device-side assert in the worker ({how}) -> cuda-fatal, latched",
                   lambda: self.fatal(state, starts, "assert", "device-side assert"))
        self.check("the latched run answers at once and starts no worker", lambda: self.latched(state, starts))
        self.check("liveness reports the latch: exit 1", lambda: self.latched_liveness(state))
        self.check("a fresh HEALTHCHECK_STATE_DIR clears the latch: readiness passes again", self.recovered)
        self.check("illegal memory access in the worker -> cuda-fatal",
                   lambda: self.fatal(self.new_state(), self.work / "starts-illegal.txt", "illegal",
                                      "illegal"), needs_gpu=True)
        self.check("another process holds nearly all GPU memory -> not checked (a warning), no worker started",
                   self.memory_held, needs_gpu=True)
        self.check(f"a kernel running at the deadline ({'CPU matmul loop' if self.fake else 'matmul loop'}) "
                   "-> reason deadline, no process left", self.deadline)

    def fatal(self, state: str, starts: Path, fault: str, label: str) -> str:
        ran = self.hc("--profile", "readiness", "--json", name=f"fault-{fault}",
                      env=self.fault_env(fault, state, starts))
        torch = ran.check("torch-cuda")
        lines = self.starts(starts)
        expect(any(ln.startswith(f"fault {fault}") for ln in lines),
               f"the fault never fired (wrapper log: {lines}): {torch.get('output')}")
        expect(ran.rc == 1 and torch.get("status") == "fail" and torch.get("reason") == "cuda-fatal",
               f"expected exit 1 and reason cuda-fatal, got exit {ran.rc}, {torch.get('status')} "
               f"({torch.get('reason')}): {torch.get('output')}")
        said = torch.get("output") or torch.get("message")  # health+json: no output on a passing check
        expect(label in str(said), f"the message does not name the fault: {said}")
        expect(sum(ln.startswith("start ") for ln in lines) == 1, f"expected 1 worker start, log: {lines}")
        return f"exit 1, cuda-fatal: {torch.get('output')}; {self.no_leftovers('the fault')}"

    def latched(self, state: str, starts: Path) -> str:
        before = sum(ln.startswith("start ") for ln in self.starts(starts))
        ran = self.hc("--profile", "readiness", "--json", name="latched-readiness",
                      env=self.fault_env("assert", state, starts))
        torch = ran.check("torch-cuda")
        after = sum(ln.startswith("start ") for ln in self.starts(starts))
        expect(ran.rc == 1 and torch.get("reason") == "latched",
               f"expected exit 1 and reason latched, got exit {ran.rc}, {torch.get('reason')}: {torch.get('output')}")
        expect(after == before, f"a worker was started: {before} -> {after} starts")
        elapsed = float(torch.get("elapsed") or 0)
        expect(elapsed < 1.0, f"the latched answer took {elapsed:.2f} s")
        return f"exit 1, reason latched in {elapsed:.3f} s (whole run {ran.wall:.2f} s), worker starts {after}"

    def latched_liveness(self, state: str) -> str:
        ran = self.hc("--profile", "liveness", "--json", name="latched-liveness",
                      env=self.with_env(HEALTHCHECK_STATE_DIR=state))
        torch = ran.check("torch-cuda")
        expect(ran.rc == 1 and torch.get("reason") == "latched",
               f"expected exit 1 and reason latched, got exit {ran.rc}, {torch.get('reason')}: {torch.get('output')}")
        return f"exit 1 in {ran.wall:.2f} s: {str(torch.get('output'))[:160]}"

    def recovered(self) -> str:
        ran = self.hc("--profile", "readiness", "--json", name="recovered",
                      env=self.with_env(HEALTHCHECK_STATE_DIR=self.new_state()))
        torch = ran.check("torch-cuda")
        expect(ran.rc == 0 and torch.get("status") == "pass",
               f"exit {ran.rc}, torch-cuda {torch.get('status')} ({torch.get('reason')}): {torch.get('output')}")
        return f"exit 0 in {ran.wall:.2f} s: {torch.get('output')}"

    def memory_held(self) -> str:
        env = self.with_env(GPU_VERIFY_MARK=f"holder-{self.mark}")
        holder = subprocess.Popen([self.torch_py, str(HERE / "hold_memory.py"), "0"], cwd=ROOT, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        held, said = "", ""
        try:
            held, said = self._read_line(holder, "HOLDING", 180)
            if not held:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    holder.wait(2)
                tail = " ".join(said.strip().splitlines()[-2:])[-300:]
                raise Fail(f"the memory holder did not report (exit {holder.poll()}): {tail}")
            free, total = (int(x) for x in held.split()[1:3])
            starts = self.work / "starts-held.txt"
            ran = self.hc("--profile", "readiness", "--json", name="memory-held",
                          env=self.fault_env("none", self.new_state(), starts))
            torch = ran.check("torch-cuda")
        finally:
            with contextlib.suppress(OSError):
                os.killpg(holder.pid, signal.SIGTERM)
            try:
                rest, _ = holder.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(holder.pid, signal.SIGKILL)
                rest, _ = holder.communicate()
            self.log("memory-holder", said + rest.decode("utf-8", "replace"))
        left, _ = self.wait_gone(15, mark=f"holder-{self.mark}")
        expect(not left, f"the memory holder is still there: {left}")
        what = f"holder left {free >> 20} MiB free of {total >> 20} MiB"
        expect(ran.rc == 0 and torch.get("status") == "warn" and torch.get("reason") == "workload-memory",
               f"{what}; expected exit 0 and a warning (workload-memory), got exit {ran.rc}, "
               f"{torch.get('status')} ({torch.get('reason')}): {torch.get('output')}")
        started = [ln for ln in self.starts(starts) if ln.startswith("start ")]
        expect(not started, f"{what}; a worker was started on the full GPU: {started}")
        return f"{what}: exit 0, warn ({torch.get('reason')}), no worker started: {torch.get('output')}"

    def _read_line(self, proc: subprocess.Popen[bytes], prefix: str, timeout: float) -> tuple[str, str]:
        """(the first line starting with prefix or "", everything read) within the timeout."""
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        end, buf = time.monotonic() + timeout, b""
        try:
            while time.monotonic() < end:
                if not sel.select(timeout=max(0.0, end - time.monotonic())):
                    break
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                for line in buf.decode("utf-8", "replace").splitlines():
                    if line.startswith(prefix):
                        return line, buf.decode("utf-8", "replace")
        finally:
            sel.close()
        return "", buf.decode("utf-8", "replace")

    def deadline(self) -> str:
        limit = 8 if self.fake else 20
        starts = self.work / "starts-hang.txt"
        ran = self.hc("--profile", "readiness", "--json", name="deadline",
                      env=self.fault_env("hang", self.new_state(), starts, HEALTHCHECK_TIMEOUT=str(limit)))
        torch = ran.check("torch-cuda")
        lines = self.starts(starts)
        expect(any(ln.startswith("kernel") for ln in lines),
               f"the kernel loop never started before the deadline (wrapper log: {lines}): {torch.get('output')}")
        expect(ran.rc == 1 and torch.get("reason") == "deadline",
               f"expected exit 1 and reason deadline, got exit {ran.rc}, {torch.get('reason')}: {torch.get('output')}")
        expect(ran.wall <= limit + 3.5, f"the answer took {ran.wall:.1f} s for HEALTHCHECK_TIMEOUT={limit}")
        return (f"exit 1 after {ran.wall:.1f} s (HEALTHCHECK_TIMEOUT={limit}): {torch.get('output')}; "
                f"{self.no_leftovers('the deadline')}")

    # -- step 4 ----------------------------------------------------------------------------

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

    # -- step 5 ----------------------------------------------------------------------------

    def step5(self) -> None:
        self.begin(5)
        n = self.runs
        self.check(f"floor: python -c pass x{n}", lambda: self.measure(
            "floor", "floor: python -c pass (the suite's interpreter)", [self.suite_py, "-c", "pass"], n))
        self.check(f"nvidia-smi query x{n}", lambda: self.measure(
            "nvidia_smi", "nvidia-smi --query-gpu=index,name,uuid (the probe's query)", list(SMI_QUERY), n))
        self.check(f"NVML init x{n}", lambda: self.nvml_init(n))
        self.check(f"torch-cuda warm x{min(n, 3)}: fresh state dir, not cached", lambda: self.torch_warm(min(n, 3)))
        state = self.new_state()
        self.check(f"liveness x{n}", lambda: self.measure(
            "liveness", "healthcheck --profile liveness", [FRONT_DOOR, "--profile", "liveness"], n,
            env=self.with_env(HEALTHCHECK_STATE_DIR=state)))
        self.check(f"readiness, torch-cuda cached x{n}", lambda: self.readiness_cached(n))
        self.check("the workers' GPU memory against HEALTHCHECK_TORCH_MIN_FREE_MIB", self.worker_memory)

    def measure(self, key: str, what: str, argv: list[str], n: int, env: dict[str, str] | None = None) -> str:
        runs = []
        for i in range(n):
            ran = self.run(argv, f"time-{key}-{i}", env=env, timeout=120)
            expect(ran.rc == 0, f"run {i + 1}: exit {ran.rc}: {ran.first_line()}")
            runs.append(ran.wall)
        t = self.timing(key, what, runs)
        floor = f" ({t['x_floor']}x floor)" if "x_floor" in t else ""
        return f"median {t['median_s']:.3f} s, min {t['min_s']:.3f}, max {t['max_s']:.3f}{floor}"

    def worker_memory(self) -> str:
        """Each CUDA worker's real peak GPU memory (tests/gpu/peak_worker.py), which the default of
        HEALTHCHECK_TORCH_MIN_FREE_MIB (plus NCCL's part for nccl) must cover."""
        workers = [("torch-cuda", ROOT / "probes/framework/torch_worker.py",
                    ["--device", "cpu" if self.fake else "cuda", "--size", "1024"], MIN_FREE_MIB)]
        if not self.fake:
            workers.append(("nccl", ROOT / "probes/framework/nccl_worker.py", [], MIN_FREE_MIB + NCCL_MIB))
        shown = []
        for name, worker, args, floor in workers:
            out = self.work / f"peak-{name}.json"
            ran = self.run([self.torch_py, str(HERE / "peak_worker.py"), str(out), str(worker), *args],
                           f"peak-{name}", env=self.with_env(CUDA_MODULE_LOADING="LAZY"), timeout=180)
            expect(out.exists(), f"{name}: the worker wrote no measurement (exit {ran.rc}): {ran.err[-300:]}")
            peak = json.loads(out.read_text())
            self.info[f"peak_mib_{name}"] = peak
            if self.fake:
                expect(not peak["cuda"], f"{name}: FAKE run used CUDA? {peak}")
                shown.append(f"{name}: measured on the CPU (FAKE: plumbing only, no GPU memory)")
                continue
            expect(peak["cuda"] and peak["peak_mib"] > 0, f"{name}: no GPU memory measured: {peak}")
            expect(peak["peak_mib"] <= floor, f"{name} peaked at {peak['peak_mib']} MiB, above the {floor} MiB "
                   "the suite asks a GPU to have free: raise the default")
            shown.append(f"{name} peak {peak['peak_mib']} MiB of {floor} (process {peak['process_mib']}, "
                         f"device delta {peak['delta_mib']}, allocator reserved {peak['reserved_mib']})")
        return "; ".join(shown)

    def nvml_init(self, n: int) -> str:
        runs, inner = [], []
        for i in range(n):
            ran = self.run([self.suite_py, "-c", NVML_INIT], f"time-nvml-init-{i}", timeout=120)
            expect(ran.rc == 0, f"run {i + 1}: exit {ran.rc}: {ran.err.strip()[-300:]}")
            runs.append(ran.wall)
            inner.append(float(ran.out.strip()))
        self.timing("nvml_process", "NVML: a whole process (python, import pynvml, nvmlInit, shutdown)", runs)
        t = self.timing("nvml_init", "NVML: nvmlInit() alone (in-process)", inner)
        return f"nvmlInit median {t['median_s'] * 1000:.1f} ms; whole process {median(runs):.3f} s"

    def torch_warm(self, n: int) -> str:
        runs, probe = [], []
        for i in range(n):
            ran = self.hc("--profile", "startup", "--only", "torch-cuda", "--json", name=f"time-torch-warm-{i}",
                          env=self.with_env(HEALTHCHECK_STATE_DIR=self.new_state()))
            torch = ran.check("torch-cuda")
            expect(ran.rc == 0 and torch.get("status") == "pass", f"run {i + 1}: exit {ran.rc}: {torch.get('output')}")
            runs.append(ran.wall)
            probe.append(float(torch.get("elapsed") or 0))
        t = self.timing("torch_warm", "torch-cuda warm (startup --only torch-cuda, fresh state dir: not cached)",
                        runs, probe_median_s=round(median(probe), 4))
        cold = self.timings.get("torch_cold", {}).get("median_s")
        versus = f"; cold was {cold:.2f} s" if cold else ""
        return f"median {t['median_s']:.2f} s (probe {median(probe):.2f} s){versus}"

    def readiness_cached(self, n: int) -> str:
        env = self.with_env(HEALTHCHECK_STATE_DIR=self.new_state())
        first = self.hc("--profile", "readiness", "--json", name="time-readiness-prime", env=env)
        expect(first.rc == 0, f"the priming run: exit {first.rc}: {first.first_line()}")
        runs = []
        for i in range(n):
            ran = self.hc("--profile", "readiness", "--json", name=f"time-readiness-{i}", env=env)
            torch = ran.check("torch-cuda")
            expect(ran.rc == 0 and "cached" in str(torch.get("output") or torch.get("message")),
                   f"run {i + 1}: exit {ran.rc}, not served from the cache: {torch.get('output')}")
            runs.append(ran.wall)
        t = self.timing("readiness_cached", "healthcheck --profile readiness (torch-cuda cached; nvidia-smi and "
                        "NVML run)", runs)
        return f"median {t['median_s']:.3f} s ({t.get('x_floor', '?')}x floor)"

    # -- all -------------------------------------------------------------------------------

    def main(self) -> int:
        mode = "FAKE self-test (fake NVML, stub nvidia-smi, CPU torch)" if self.fake else "real GPU"
        print(f"gpu-verify: {mode}; results in {self.out}", flush=True)
        for step in (self.step0, self.step1, self.step2, self.step3, self.step4, self.step5):
            try:
                step()
            except Exception as exc:  # a bug between checks: recorded, the next step still runs
                self.log("internal-step", traceback.format_exc())
                self.record(f"{step.__name__} (between checks)", FAIL, f"{type(exc).__name__}: {exc}")
        self.save()
        print(f"\ngpu-verify: {self.verdict()}; summary: {self.out / 'summary.md'}", flush=True)
        return 1 if any(c["status"] == FAIL for c in self.checks) else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="the checks of make gpu-verify (see tests/gpu/verify.sh --help)")
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--suite-python", required=True)
    p.add_argument("--torch-python", required=True)
    p.add_argument("--install", default=None, help="the install step's result (JSON) from verify.sh")
    p.add_argument("--fake", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(Verify(parse_args(sys.argv[1:])).main())
