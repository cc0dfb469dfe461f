"""The real worker with the real (CPU) build of torch installed in the suite's venv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from probes.framework import torch_cuda, torch_worker
from probes.result import Status
from tests.conftest import clean_env, run_cli
from tests.framework.conftest import REAL_PYTHON, probe


def test_cpu_device_runs_the_real_op_and_comparison(tmp_path: Path) -> None:
    result, _, data = probe(REAL_PYTHON, tmp_path, device="cpu")
    assert result.status is Status.PASS, result.message
    assert result.message.startswith("CPU OK: 1024x1024 matmul matches the CPU reference")
    assert result.observed == 1
    dev = data["report"]["devices"][0]
    # A real float32 matmul against a real float64 reference: small but not zero.
    assert 0 < dev["max_err"] / dev["scale"] < torch_cuda.TOLERANCE
    assert dev["op_ms"] > 0


def test_cuda_on_a_cpu_build_is_not_available_with_remedy(tmp_path: Path) -> None:
    result, _, _ = probe(REAL_PYTHON, tmp_path, device="cuda")
    assert result.status is Status.FAIL
    assert result.reason == "cpu-only-build"
    assert result.message.startswith("CUDA not available: torch 2.13.0+cpu")
    assert "HEALTHCHECK_TORCH_DEVICE=cpu" in result.message
    assert "Traceback" not in result.message


def test_worker_prints_exactly_one_valid_line() -> None:
    done = subprocess.run([REAL_PYTHON, torch_worker.__file__, "--device", "cpu", "--size", "64"],
                          capture_output=True, timeout=120, check=True)
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(torch_worker.PREFIX)
    report = torch_cuda.validate(json.loads(lines[0][len(torch_worker.PREFIX):]), "cpu", 64)
    assert report["error"] is None and report["torch"].startswith("2.")


def test_cli_end_to_end(tmp_path: Path) -> None:
    env = clean_env(HEALTHCHECK_TORCH_PYTHON=REAL_PYTHON, HEALTHCHECK_STATE_DIR=str(tmp_path / "st"))
    ok = run_cli("--only", "torch-cuda", env={**env, "HEALTHCHECK_TORCH_DEVICE": "cpu"})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS torch-cuda" in ok.stdout
    bad = run_cli("--only", "torch-cuda", "--json", env={**env, "HEALTHCHECK_TORCH_DEVICE": "cuda"})
    assert bad.returncode == 1
    check = json.loads(bad.stdout)["checks"]["torch-cuda:devices"][0]
    assert check["status"] == "fail" and check["reason"] == "cpu-only-build"
    assert "CUDA not available" in check["output"]


def test_an_address_space_limit_too_small_for_torch_is_named_as_a_memory_limit(tmp_path: Path) -> None:
    """The whole run under a runtime's RLIMIT_AS (prlimit, as `docker run --ulimit as=` or `ulimit -v`):
    torch's import fails as 'failed to map segment from shared object' (an ImportError naming _C), as
    std::bad_alloc and abort(), or as a MemoryError, depending on where it runs out. None of those is a
    missing module or a torch crash."""
    import shutil
    import sys

    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("needs prlimit (util-linux)")
    env = clean_env(HEALTHCHECK_TORCH_PYTHON=REAL_PYTHON, HEALTHCHECK_TORCH_DEVICE="cpu",
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "st"), HEALTHCHECK_CHECKS_DIR=str(tmp_path / "none"))
    limited = []
    for mib in (250, 400, 550):
        out = subprocess.run([prlimit, f"--as={mib << 20}", sys.executable, "-m", "probes", "--only", "torch-cuda",
                              "--profile", "startup", "--json"], env=env, capture_output=True, text=True,
                             timeout=120, check=False)
        assert "Traceback" not in out.stderr, out.stderr
        check = json.loads(out.stdout)["checks"]["torch-cuda:devices"][0]
        if check["status"] == "pass":
            continue
        assert (check["status"], check["reason"]) == ("fail", "memory-limit"), (mib, check)
        assert f"out of memory (RLIMIT_AS={mib << 20}" in check["output"] and "_C" not in check["output"]
        assert "raise the container's memory or address-space limit" in check["output"]
        limited.append(mib)
    assert 250 in limited, "torch imported under 250 MiB of address space: the test proves nothing"
