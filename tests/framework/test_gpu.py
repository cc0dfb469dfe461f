"""The CUDA path on a real GPU: every device, synchronize and mem_get_info.

Needs a GPU and an interpreter with a CUDA build of torch (HEALTHCHECK_TORCH_PYTHON,
else the suite's own interpreter). Skipped with a visible reason where there is none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from probes.framework import deep, torch_cuda, torch_worker
from probes.result import Result, Status
from tests.framework.conftest import probe

pytestmark = pytest.mark.gpu

PY = os.environ.get("HEALTHCHECK_TORCH_PYTHON") or sys.executable


def nvidia_smi_count() -> int:
    smi = shutil.which("nvidia-smi")
    if not smi:
        pytest.skip("no CUDA device: nvidia-smi not found")
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


def worker_report(*extra: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([PY, torch_worker.__file__, "--device", "cuda", "--size", str(torch_cuda.SIZE), *extra],
                          capture_output=True, timeout=300, check=True, env=env)
    report, problem = deep.parse(done.stdout, torch_worker.PREFIX,
                                 lambda report: torch_cuda.validate(report, "cuda", torch_cuda.SIZE))
    assert report is not None, problem
    if report["cuda_built"] is False:
        pytest.skip(f"{PY} has a CPU-only torch: set HEALTHCHECK_TORCH_PYTHON to one with CUDA")
    return report


def test_worker_checks_every_gpu_with_memory_info() -> None:
    count = nvidia_smi_count()
    report = worker_report()
    assert report["error"] is None and report["available"] is True and report["count"] == count
    for dev in report["devices"]:
        assert dev["error"] is None, dev["error"]
        assert 0 < dev["free"] <= dev["total"]  # mem_get_info answered
        assert dev["op_ms"] > 0  # timed between two synchronize() calls
        assert dev["max_err"] / dev["scale"] < torch_cuda.TOLERANCE  # TF32 off


def test_probe_passes_and_agrees_with_nvml(tmp_path: Path) -> None:
    count = nvidia_smi_count()
    worker_report()  # skips on a CPU-only torch
    nvml = Result("nvml", Status.PASS, "ok", facts={"count": count, "gpus": []})
    result, _, _ = probe(PY, tmp_path, profile="startup", timeout=120, results={"nvml": nvml})
    assert result.status is Status.PASS, result.message
    assert result.observed == count and len(result.facts["devices"]) == count


def test_multi_gpu_subset_through_cuda_visible_devices(tmp_path: Path) -> None:
    count = nvidia_smi_count()
    if count < 2:
        pytest.skip(f"needs 2 or more GPUs, found {count}")
    report = worker_report(env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"})
    assert report["count"] == 1 and report["visible_devices"] == "1"
    data = {"kind": "worker", "python": PY, "device": "cuda", "expect": count, "report": report}
    result = torch_cuda.judge(data, None)  # type: ignore[arg-type]
    assert result.status is Status.PASS and f"1 of {count} GPUs visible" in result.message
    assert json.dumps(result.facts)  # facts stay serialisable
