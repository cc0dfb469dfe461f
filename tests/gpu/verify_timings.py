"""Step 5 of `make gpu-verify`: the timings (medians) against the python floor, and each CUDA
worker's peak GPU memory against HEALTHCHECK_TORCH_MIN_FREE_MIB.
"""

from __future__ import annotations

import json

from verify_core import (
    FRONT_DOOR,
    HERE,
    MIN_FREE_MIB,
    NCCL_MIB,
    NVML_INIT,
    ROOT,
    SMI_QUERY,
    Core,
    expect,
    median,
)


class TimingChecks(Core):
    """Step 5."""

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
