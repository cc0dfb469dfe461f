"""Step 3 of `make gpu-verify`: real CUDA faults in the torch worker (through fault-python.sh)
give cuda-fatal and latch; the latch answers at once and a fresh state dir clears it;
memory held by another process gives a warning; a kernel at the deadline leaves nothing.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path

from verify_core import FAULT_PYTHON, HERE, ROOT, Core, Fail, expect


class FaultChecks(Core):
    """Step 3."""

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
