"""Test only: arrange a CUDA fault inside the torch worker's process, then run the real worker.

Started by tests/gpu/fault-python.sh (what HEALTHCHECK_TORCH_PYTHON points at during
`make gpu-verify`) as ``fault_worker.py WORKER_FILE WORKER_ARGS...``. It imports torch,
replaces ``torch.matmul`` in this process, then runs the worker file unchanged with runpy,
so the probe sees the real worker meet a real fault. The fault fires in the worker's first
matmul on a GPU (never in the float64 CPU reference) and is chosen by GPU_VERIFY_FAULT:

  assert   an index kernel reads out of bounds: "CUDA error: device-side assert triggered"
  illegal  a kernel reads 1 TiB past a real allocation (or, if torch refuses that, memory already
           given back to the driver): "an illegal memory access was encountered"
  hang     8192x8192 matmuls queued without end: a long-running kernel for the deadline to kill
  none     no fault

GPU_VERIFY_SIMULATE=1 (the FAKE self-test, CPU torch): "assert" and "illegal" raise the text
CUDA would give, and "hang" loops matmuls on the CPU, so the plumbing (latch, start count,
deadline, leftovers) is exercised without a GPU.

Each fault adds a "fault KIND PID" line to GPU_VERIFY_STARTS when it fires ("start PID"
lines come from the wrapper). The faults stay inside this process's own CUDA context, which
dies with it; no GPU setting is touched.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any, Callable

FAULTS = ("assert", "illegal", "hang", "none")


def note(word: str) -> None:
    path = os.environ.get("GPU_VERIFY_STARTS")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{word} {os.getpid()}\n")


class _CudaArray:
    """Raw device memory seen as a float32 CUDA array (__cuda_array_interface__): torch
    takes the pointer, shape and strides as given, without checking them against an allocation."""

    def __init__(self, ptr: int, length: int, stride_bytes: int = 4):
        self.__cuda_array_interface__ = {"shape": (length,), "strides": (stride_bytes,), "typestr": "<f4",
                                         "data": (ptr, False), "version": 2}


def _past_the_end(torch: Any, device: Any) -> None:
    """Read an element 1 TiB past a real allocation."""
    base = torch.zeros(1, device=device)
    view = torch.as_tensor(_CudaArray(base.data_ptr(), 2, 1 << 40), device=device)
    view.sum().item()
    torch.cuda.synchronize(device)


def _after_free(torch: Any, device: Any) -> None:
    """Read memory that was handed back to the driver (a segment of its own, then empty_cache)."""
    base = torch.zeros(16 << 20, device=device)  # 64 MiB: its own segment in the caching allocator
    view = torch.as_tensor(_CudaArray(base.data_ptr(), 16 << 20), device=device)  # keeps no reference
    del base
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # cudaFree: the addresses are no longer mapped
    view.sum().item()
    torch.cuda.synchronize(device)


def illegal_access(torch: Any, device: Any) -> None:
    """An illegal memory access by one of two means; raises CUDA's error once one worked."""
    refused = []
    for means in (_past_the_end, _after_free):
        try:
            means(torch, device)
        except Exception as exc:  # torch refusing the view raises TypeError, ValueError...
            if "cuda error" in str(exc).lower() or "illegal" in str(exc).lower():
                raise  # the fault: let the worker report it
            refused.append(f"{means.__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        refused.append(f"{means.__name__}: no fault")
    raise RuntimeError("could not arrange an illegal memory access (" + "; ".join(refused) + ")")


def fire(torch: Any, kind: str, a: Any, b: Any, matmul: Callable[..., Any], simulate: bool) -> None:
    note(f"fault {kind}")
    if kind == "assert":
        if simulate:
            raise RuntimeError("CUDA error: device-side assert triggered (simulated on the CPU)")
        flat = a.reshape(-1)
        index = torch.tensor([flat.numel() + 1000], device=a.device)
        flat[index].sum().item()  # the index kernel's bounds check asserts on the device
        torch.cuda.synchronize(a.device)
    elif kind == "illegal":
        if simulate:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated on the CPU)")
        illegal_access(torch, a.device)  # an MMU fault, sticky for this context
    elif kind == "hang":
        x = a if simulate else torch.randn(8192, 8192, device=a.device)
        note("kernel")
        while True:  # queued asynchronously; the launch queue fills and blocks us in the driver
            matmul(x, x)


def install(torch: Any, kind: str, simulate: bool) -> None:
    matmul = torch.matmul

    def patched(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        on_target = bool(getattr(a, "is_cuda", False)) or (simulate and a.dtype == torch.float32)
        if on_target:
            fire(torch, kind, a, b, matmul, simulate)
        return matmul(a, b, *args, **kwargs)

    if kind != "none":
        torch.matmul = patched


def main() -> None:
    kind = os.environ.get("GPU_VERIFY_FAULT", "none")
    if len(sys.argv) < 2 or kind not in FAULTS:
        sys.stderr.write(f"usage: GPU_VERIFY_FAULT={'|'.join(FAULTS)} fault_worker.py WORKER_FILE ARGS...\n")
        sys.exit(3)
    import torch

    install(torch, kind, os.environ.get("GPU_VERIFY_SIMULATE") == "1")
    worker = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(worker, run_name="__main__")


if __name__ == "__main__":
    main()
