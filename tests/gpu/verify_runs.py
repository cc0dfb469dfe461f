"""Steps 0 to 2 of `make gpu-verify`: the install and the first CUDA context, the gpu-marked
tests, and healthcheck in every profile, text and --json.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
from pathlib import Path

from verify_core import FAIL, PASS, ROOT, TORCH_FACTS, Core, expect


class RunChecks(Core):
    """Steps 0 to 2."""

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
