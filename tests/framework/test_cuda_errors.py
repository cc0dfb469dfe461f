"""CUDA errors by identity (probes/framework/cuda_errors.py): the table, how an error is found in a
message, and torch-cuda's verdict on each class, through the worker's validated report line."""

from __future__ import annotations

import copy
import json
import types

import pytest

from probes.framework import cuda_errors, deep, torch_cuda, torch_worker
from probes.registry import PROBES
from probes.result import Result, Status

from .test_parse import GOOD

TAIL = ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with "
        "`TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
CTX = types.SimpleNamespace(results={})


def judged(message: str, *, code: int | None = None, phase: str = "device", kind: str = "RuntimeError") -> Result:
    """torch-cuda's verdict on a worker that met this error, the report passed through validate()."""
    report = copy.deepcopy(GOOD)
    err = {"phase": phase, "type": kind, "message": message, "device": 0 if phase == "device" else None,
           "module": None, "code": code}
    if phase == "device":
        report["devices"][0].update(op_ms=None, max_err=None, scale=None, free=None, total=None, error=err)
    else:
        report.update(available=False, count=None, devices=[], error=err)
    raw = (torch_worker.PREFIX + json.dumps(report) + "\n").encode()
    parsed, problem = deep.parse(raw, torch_worker.PREFIX,
                                 lambda report: torch_cuda.validate(report, "cuda", torch_cuda.SIZE))
    assert problem is None, problem
    data = {"kind": "worker", "python": "python3", "device": "cuda", "expect": None, "report": parsed}
    return torch_cuda.judge(data, CTX)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "words"), [
    ("no kernel image is available for execution on the device", "install a torch built for it"),
    ("invalid device ordinal", "CUDA_VISIBLE_DEVICES"),
    ("invalid configuration argument", "more threads, blocks or shared memory"),
])
def test_the_dsa_tail_never_makes_an_error_sticky(text: str, words: str) -> None:
    result = judged(f"CUDA error: {text}\n{TAIL}")
    assert (result.status, result.reason) == (Status.FAIL, "cuda-error"), result.message
    assert not result.facts.get("fatal") and text in result.message and words in result.message


@pytest.mark.parametrize(("text", "name"), [
    ("the launch timed out and was terminated", "cudaErrorLaunchTimeout 702"),
    ("uncorrectable NVLink error detected during the execution", "cudaErrorNvlinkUncorrectable 220"),
    ("an illegal instruction was encountered", "cudaErrorIllegalInstruction 715"),
    ("operation not supported on global/shared address space", "cudaErrorInvalidAddressSpace 717"),
    ("uncorrectable ECC error encountered", "cudaErrorECCUncorrectable 214"),
])
def test_sticky_errors_in_any_wording_latch(text: str, name: str) -> None:
    result = judged(f"RuntimeError: CUDA error: {text}\n{TAIL}")
    assert (result.status, result.reason) == (Status.FAIL, "cuda-fatal"), result.message
    assert result.facts["fatal"] is True and name in result.message


@pytest.mark.parametrize("message", [
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
])
def test_a_library_without_memory_could_not_check(message: str) -> None:
    result = judged(message)
    assert (result.status, result.reason) == (Status.WARN, "oom"), result.message
    assert "not checked, not a fault" in result.message


@pytest.mark.parametrize(("code", "reason"), [(710, "cuda-fatal"), (209, "cuda-error"), (2, "oom")])
def test_the_error_code_decides_over_the_text(code: int, reason: str) -> None:
    result = judged("CUDA error: invalid argument\n" + TAIL, code=code, kind="AcceleratorError")
    assert result.reason == reason, result.message
    assert result.facts["cuda_error"]["how"] == "code"


@pytest.mark.parametrize(("error", "reason", "words"), [
    ("Error 802: system not yet initialized", "fabric-manager", "Fabric Manager"),
    ("Error 803: system has unsupported display driver / cuda driver combination", "driver-mismatch",
     "does not match the loaded kernel module"),
    ("Error 804: forward compatibility was attempted on non supported HW", "forward-compat", "cuda-compat"),
])
def test_environment_errors_at_start_have_their_own_reason(error: str, reason: str, words: str) -> None:
    message = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
               f"before calling NumCudaDevices() that might have already set an error? {error}")
    result = judged(message, phase="init", kind="Warning")
    assert (result.status, result.reason) == (Status.FAIL, reason), result.message
    assert words in result.message and not result.facts.get("fatal")


def test_an_unknown_error_at_start_fails_without_latching() -> None:
    result = judged("CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env "
                    "variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero.",
                    phase="init")
    assert (result.status, result.reason) == (Status.FAIL, "cuda-unknown") and not result.facts.get("fatal")
    assert "daemon-reload" in result.message


@pytest.mark.parametrize("message", [
    TAIL,
    "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.",
    "FileNotFoundError: file not found: /models/m.pt",  # a CUDA text on a line that is not about CUDA
    "NCCL Error 1: unhandled cuda error",  # NCCL's number is not a cudaError_t
])
def test_what_is_not_a_cuda_error_we_can_name(message: str) -> None:
    assert cuda_errors.identify(None, message) is None


@pytest.mark.parametrize(("message", "code", "how"), [
    ("RuntimeError: cuda runtime error (6) : the launch timed out and was terminated at THCGeneral.cpp:70",
     702, "text"),  # 6 was the launch timeout before CUDA 10.1: the text decides
    ("RuntimeError: CUDA error 700", 700, "number"),
    ("CUDA: Check failed: e == cudaSuccess (804 vs. 0)", 804, "number"),
    ("failed call to cuInit: CUDA_ERROR_SYSTEM_NOT_READY", 802, "name"),
    ("CUDA error: an illegal memory access was encountered\\nCUDA kernel errors might be", 700, "text"),
    ("The NVIDIA driver on your system is too old (found version 11040).", 35, "text"),
    ("CUDA error: out of memorySearch for `cudaErrorMemoryAllocation' in https://docs.nvidia.com", 2, "text"),
])
def test_identity_from_text_then_number_then_name(message: str, code: int, how: str) -> None:
    found = cuda_errors.identify(None, message)
    assert found is not None and (found.error.code, found.how) == (code, how)


def test_the_table_follows_the_runtime_documentation() -> None:
    codes = [e.code for e in cuda_errors.TABLE]
    assert len(codes) == len(set(codes)) and all(e.name.startswith("cudaError") for e in cuda_errors.TABLE)
    sticky = {e.code for e in cuda_errors.TABLE if e.category == cuda_errors.STICKY}
    assert sticky == {214, 220, 226, 700, 702, 710, 714, 715, 716, 717, 718, 719, 721, 810, 911}
    assert {c: cuda_errors.BY_CODE[c].category for c in (2, 46, 9, 101, 209, 802, 803, 804, 999)} == {
        2: "could-not-check", 46: "could-not-check", 9: "other", 101: "other", 209: "other",
        802: "environment", 803: "environment", 804: "environment", 999: "environment"}


def test_every_reason_in_the_table_is_in_the_cause_tables() -> None:
    reasons = {e.reason for e in (*cuda_errors.TABLE, *cuda_errors.LIBRARY)} | {"cuda-error", "workload-memory"}
    causes = {s.name: {c.reason for c in s.causes} for s in PROBES}
    assert reasons <= causes["torch-cuda"]
    # model and nccl, behind torch-cuda, say less: an error at start is a plain CUDA error there
    shared = {"cuda-fatal", "cuda-error", "oom", "device-busy", "workload-memory"}
    assert shared <= causes["model"] and shared <= causes["nccl"]


def test_the_workers_benign_list_is_the_tables_could_not_check() -> None:
    rows = [e for e in (*cuda_errors.TABLE, *cuda_errors.LIBRARY) if e.category == cuda_errors.NOT_CHECKED]
    codes = tuple(sorted(e.code for e in rows if e.code is not None))
    words = {t.lower() for e in rows for t in (e.text, *e.aliases) if t and not t.startswith("CUDA_ERROR_")}
    words |= {e.name.lower() for e in rows if e.code is None}
    assert (codes, tuple(sorted(words))) == (torch_worker.BENIGN_CODES, torch_worker.BENIGN)


def test_the_worker_keeps_the_code_and_the_lines() -> None:
    torch = pytest.importorskip("torch")
    exc = torch.AcceleratorError("CUDA error: invalid argument\n" + TAIL + "frame #0: x\n" * 500)
    exc.error_code = 710
    err = torch_worker.error("device", exc, 0)
    assert err["code"] == 710 and err["message"].startswith("CUDA error: invalid argument\nCUDA kernel errors")
    assert len(err["message"]) == torch_worker.MAX_TEXT
    assert not torch_worker.benign(err)
    err = torch_worker.error("device", torch.AcceleratorError("CUDA error: out of memory"), 0)
    assert err["code"] is None and torch_worker.benign(err)


def test_a_cuda_error_line_after_a_long_first_line_is_still_found() -> None:
    # The worker used to squash the message onto one line and cut it at 400 characters.
    noise = "UserWarning: " + "an earlier warning the library printed into the exception text " * 8
    err = torch_worker.error("device", RuntimeError(
        f"{noise}\nRuntimeError: CUDA error: an illegal memory access was encountered\n{TAIL}"), 0)
    found = cuda_errors.identify(err.get("code"), err["message"])
    assert found is not None and found.error.code == 700
