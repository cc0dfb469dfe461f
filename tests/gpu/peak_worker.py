"""Test only: how much GPU memory a worker of the suite really takes (make gpu-verify).

    python peak_worker.py OUT_JSON WORKER_FILE WORKER_ARGS...

Runs the worker file unchanged with runpy, in this process. The workers end with ``os._exit``
(no exit handlers), so that call is wrapped: just before the process ends, while its CUDA context
and tensors still exist, it writes OUT_JSON with

- ``process_mib``: what NVML says this process uses on each GPU (``usedGpuMemory``: the CUDA
  context, the caching allocator's segments, cuBLAS's workspace), when NVML lists this pid (inside
  a container it may list host pids only);
- ``delta_mib``: how much each GPU's used memory grew between this process's start and its end
  (the same measure when nothing else runs on the GPU);
- ``reserved_mib`` and ``allocated_mib``: torch's caching allocator peaks per device;
- ``peak_mib``: the largest of those, the number HEALTHCHECK_TORCH_MIN_FREE_MIB must cover.

It only reads: nvmlInit/nvmlShutdown and queries, never a GPU setting.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any

MIB = 1 << 20


def nvml_used() -> tuple[dict[int, int], dict[int, int], str | None]:
    """({gpu: MiB used on it}, {gpu: MiB this pid uses}, why NVML could not answer)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no NVML here (the FAKE self-test runs on the CPU)
        return {}, {}, f"{type(exc).__name__}: {exc}"[:200]
    used, mine = {}, {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            used[i] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) // MIB
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    mine[i] = int(proc.usedGpuMemory) // MIB
    finally:
        pynvml.nvmlShutdown()
    return used, mine, None


def torch_peaks() -> tuple[dict[int, int], dict[int, int]]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}, {}
    count = torch.cuda.device_count()
    return ({i: torch.cuda.max_memory_reserved(i) // MIB for i in range(count)},
            {i: torch.cuda.max_memory_allocated(i) // MIB for i in range(count)})


def report(before: dict[int, int]) -> dict[str, Any]:
    after, mine, why = nvml_used()
    reserved, allocated = torch_peaks()
    delta = {i: after[i] - before[i] for i in after if i in before}
    peak = max([*mine.values(), *delta.values(), *reserved.values(), 0])
    return {"cuda": bool(reserved), "process_mib": mine, "delta_mib": delta, "reserved_mib": reserved,
            "allocated_mib": allocated, "peak_mib": peak, "nvml_error": why}


def main() -> None:
    out, worker = sys.argv[1], sys.argv[2]
    before, _, _ = nvml_used()
    real_exit = os._exit

    def measured_exit(status: int) -> None:
        try:
            with open(out, "w", encoding="utf-8") as fh:
                json.dump(report(before), fh)
        finally:
            real_exit(status)

    os._exit = measured_exit  # type: ignore[assignment]
    sys.argv = sys.argv[2:]
    runpy.run_path(worker, run_name="__main__")


if __name__ == "__main__":
    main()
