"""model and nccl judge CUDA errors by the same table as torch-cuda (a sticky one latches, out of
memory warns), start nothing on a GPU whose memory the workload holds, and nccl blames /dev/shm's
size only for a segment NCCL could not extend. Workers are stub interpreters that print the line a
real worker prints after meeting the error (NCCL's own warnings on stderr)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from probes.config import Config
from probes.context import Context
from probes.framework import model, model_worker, nccl, nccl_worker, torch_cuda
from probes.result import Result, Status
from probes.state import State
from tests.framework.conftest import Interp
from tests.hardware.conftest import fake_nvml  # noqa: F401  (the fixture)
from tests.hardware.conftest import scenario as scenario_file  # noqa: F401  (the fixture)

TAIL = (" CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect. For debugging consider passing CUDA_LAUNCH_BLOCKING=1 Compile with "
        "`TORCH_USE_CUDA_DSA` to enable device-side assertions.")
MODEL_OK = {"v": model_worker.SCHEMA, "device": "cuda", "torch": "2.8.0", "format": "state-dict", "loader": None,
            "file_bytes": 8, "bytes": 8, "budget": 2**30, "budget_source": "free GPU memory", "load_ms": None,
            "params": None, "param_bytes": None, "peak_gpu": None, "forward_ms": None, "max_err": None,
            "scale": None, "error": None}
NCCL_FAILED = {"v": nccl_worker.SCHEMA, "backend": "nccl", "torch": "2.8.0", "nccl": "2.21.5", "count": 2,
               "ms": None, "bad": None, "max_err": None}


def printing(make_interp: Callable[..., Interp], name: str, prefix: str, report: dict[str, Any],
             stderr: str = "") -> Interp:
    lines = [f"echo '{line}' >&2" for line in stderr.splitlines()]
    lines.append(f"echo '{prefix}{json.dumps(report)}'")
    return make_interp(name, body="\n".join(lines))


def context(tmp_path: Path, python: object, **settings: Any) -> Context:
    cfg = Config()._replace(profile="startup", torch_python=str(python), torch_device="cuda", **settings)
    return Context(cfg, time.monotonic() + 30, {}, State.open(str(tmp_path / "state")))


def run_model(tmp_path: Path, python: object, **settings: Any) -> tuple[Result, Context]:
    path = tmp_path / "m.pt"
    if not path.exists():
        path.write_bytes(b"\x80" + b"\x00" * 7)
    ctx = context(tmp_path, python, model_path=str(path), **settings)
    return model.judge(model.gather(ctx), ctx), ctx


def run_nccl(tmp_path: Path, python: object, **settings: Any) -> tuple[Result, Context]:
    ctx = context(tmp_path, python, nccl_min_shm_mib=0, **settings)
    return nccl.judge(nccl.gather(ctx), ctx), ctx


def liveness(ctx: Context) -> Result:
    live = Context(ctx.config._replace(profile="liveness"), time.monotonic() + 5, {}, ctx.state)
    return torch_cuda.judge(torch_cuda.gather(live), live)


@pytest.mark.parametrize(("message", "code", "status", "reason", "latch"), [
    ("CUDA error: an illegal memory access was encountered" + TAIL, 700, Status.FAIL, "cuda-fatal", True),
    ("CUDA error: no kernel image is available for execution on the device" + TAIL, None, Status.FAIL,
     "cuda-error", False),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", None, Status.WARN, "oom",
     False),
    ("CUDA error: MPS server is not ready to accept new MPS client requests" + TAIL, 807, Status.WARN,
     "mps-busy", False),
])
def test_model_judges_cuda_errors_by_the_table(tmp_path: Path, make_interp: Callable[..., Interp], message: str,
                                               code: int | None, status: Status, reason: str, latch: bool) -> None:
    report = {**MODEL_OK, "error": {"kind": "load", "type": "AcceleratorError", "message": message, "code": code}}
    result, ctx = run_model(tmp_path, printing(make_interp, "py", model_worker.PREFIX, report))
    assert (result.status, result.reason) == (status, reason), result.message
    assert (ctx.state.latch() is not None) is latch
    assert liveness(ctx).reason == ("latched" if latch else None)


@pytest.mark.parametrize(("report", "stderr", "status", "reason", "latch"), [
    # NCCL's "unhandled cuda error" names the CUDA error only in its warning
    ({"kind": "collective", "type": "RuntimeError", "message": "NCCL Error 1: unhandled cuda error", "code": None},
     "node1:1:2 [0] enqueue.cc:100 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
     Status.FAIL, "cuda-fatal", True),
    ({"kind": "collective", "type": "RuntimeError", "message": "NCCL Error 1: unhandled cuda error", "code": None},
     "node1:1:2 [0] include/alloc.h:100 NCCL WARN Cuda failure 'out of memory'", Status.WARN, "oom", False),
    ({"kind": "collective", "type": "AcceleratorError", "message": "CUDA error: misaligned address" + TAIL,
      "code": 716}, "", Status.FAIL, "cuda-fatal", True),
])
def test_nccl_judges_cuda_errors_by_the_table(tmp_path: Path, make_interp: Callable[..., Interp],
                                              report: dict[str, Any], stderr: str, status: Status, reason: str,
                                              latch: bool) -> None:
    python = printing(make_interp, "py", nccl_worker.PREFIX, {**NCCL_FAILED, "error": report}, stderr)
    result, ctx = run_nccl(tmp_path, python)
    assert (result.status, result.reason) == (status, reason), result.message
    assert (ctx.state.latch() is not None) is latch


# NCCL 2.24's warnings when a segment another thread created is gone (github.com/NVIDIA/nccl/issues/1589),
# and when /dev/shm is full (github.com/pytorch/ci-infra/pull/490).
ATTACH = ("g148:14937:69361 [0] misc/shmutils.cc:93 NCCL WARN Call to open failed: No such file or directory\n"
          "g148:14937:69361 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment "
          "/dev/shm/nccl-glnlGK (size 14156128), error: No such file or directory (2)")
FULL = ("runner:202016:202235 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE "
        "to 9637892 bytes, error: No space left on device (28)\n"
        "runner:202016:202235 [0] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-WU88OE (size 9637888), error: No space left on device (28)")


@pytest.mark.parametrize(("stderr", "reason", "words"), [
    (ATTACH, "nccl-shm", "NCCL_SHM_DISABLE=1"),
    (FULL, "shm-too-small", "--shm-size"),
])
def test_only_a_full_dev_shm_blames_its_size(tmp_path: Path, make_interp: Callable[..., Interp], stderr: str,
                                             reason: str, words: str) -> None:
    report = {"kind": "collective", "type": "RuntimeError", "message": "NCCL Error 2: unhandled system error",
              "code": None}
    result, _ = run_nccl(tmp_path, printing(make_interp, "py", nccl_worker.PREFIX, {**NCCL_FAILED, "error": report},
                                            stderr))
    assert (result.status, result.reason) == (Status.FAIL, reason), result.message
    assert words in result.message


def test_model_and_nccl_start_nothing_on_a_full_gpu(tmp_path: Path, make_interp: Callable[..., Interp],
                                                    fake_nvml: Path,  # noqa: F811
                                                    scenario_file: Callable[..., Path]) -> None:  # noqa: F811
    python = make_interp("py")
    scenario_file("gpus 1", "gpu 0 memory 81559 80800")  # 759 MiB free
    result, _ = run_model(tmp_path, python)
    assert (result.status, result.reason) == (Status.WARN, "workload-memory"), result.message
    assert "needs 1025 MiB (HEALTHCHECK_TORCH_MIN_FREE_MIB plus the model's size)" in result.message
    result, _ = run_nccl(tmp_path, python)
    assert (result.status, result.reason) == (Status.WARN, "workload-memory"), result.message
    assert "needs 1280 MiB" in result.message
    assert python.starts == 0
    scenario_file("gpus 1", "gpu 0 memory 1000 0")  # an idle GPU too small for the model: not the workload
    result, _ = run_model(tmp_path, python)
    assert (result.status, result.reason) == (Status.FAIL, "would-not-fit") and python.starts == 0
