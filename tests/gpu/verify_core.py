"""The shared part of `make gpu-verify`'s checks (tests/gpu/verify.py): settings, running
commands in their own session, finding what a run left behind, and the result files
(result.json, summary.md, logs/) rewritten after every check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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
MIN_FREE_MIB = 1024  # HEALTHCHECK_TORCH_MIN_FREE_MIB's default (probes/framework/deep.py)
NCCL_MIB = 256  # what the suite adds for NCCL's buffers (probes/framework/nccl.py, BUFFERS_MIB)
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




class Core:
    """What every check shares: the environment, running commands, recording results."""

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
                   GPU_VERIFY_MARK=self.mark)
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
