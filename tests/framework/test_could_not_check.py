"""Acceptance: "could not check" is not "unhealthy", through the CLI.

The whole front half of the stack is real: the CLI, the runner, the nvml probe over the real
nvidia-ml-py bindings and the fake libnvidia-ml.so.1, a stub nvidia-smi on PATH, and the
torch-cuda worker in a fake torch interpreter. Each case runs readiness then liveness.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import ROOT
from tests.fakes.nvidia_smi_stub import write_stub
from tests.framework.conftest import Interp
from tests.hardware.conftest import cli_env, fake_nvml  # noqa: F401  (the fixture)


def _run(tmp_path: Path, python: Interp, scenario: list[str], profile: str) -> subprocess.CompletedProcess:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    write_stub(stubs, "ok", gpus=1)
    path = tmp_path / "scenario.txt"
    path.write_text("".join(line + "\n" for line in scenario))
    env = cli_env(tmp_path, stub_dir=stubs, scenario_file=path, HEALTHCHECK_GPU_COUNT="1",
                  HEALTHCHECK_TORCH_PYTHON=str(python), ENABLE_JUPYTER_CHECK="false",
                  ENABLE_SSH_CHECK="false")
    return subprocess.run([sys.executable, "-m", "probes", "--profile", profile], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90)


MIG_SLICE = ["gpus 1", "gpu 0 mig 1", "gpu 0 field-error ecc 4", "gpu 0 field-error temperature 4",
             "gpu 0 field-error clocks 4"]


@pytest.mark.parametrize(("scenario", "mode", "words"), [
    # exclusive mode, held by another process: torch-cuda warns and names the holder
    (["gpus 1", "gpu 0 compute-mode EXCLUSIVE_PROCESS", "gpu 0 process 4242 70000 python"], "busy",
     "WARN torch-cuda"),
    # MPS: the clients are named and the reason is its own
    (["gpus 1", "gpu 0 compute-mode EXCLUSIVE_PROCESS", "gpu 0 mps-process 77 100 nvidia-cuda-mps-server"],
     "busy", "MPS client pid 77"),
    # a MIG slice: the parent GPU answers NO_PERMISSION
    (MIG_SLICE, "ok", "WARN nvml"),
    # out of memory during the op while the workload uses the GPU (NVML still showed room for the probe)
    (["gpus 1", "gpu 0 memory 81559 79000", "gpu 0 process 4242 78000 python", "gpu 0 field-error ecc 4"],
     "oom", "out of memory for the probe's own context (held by pid 4242 (python))"),
])
def test_could_not_check_warns_and_exits_0_in_readiness_and_liveness(
        tmp_path: Path, fake_nvml: Path, make_interp: Callable[..., Interp],  # noqa: F811
        scenario: list[str], mode: str, words: str) -> None:
    python = make_interp("py", mode=mode)
    ready = _run(tmp_path, python, scenario, "readiness")
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert ready.stdout.startswith("healthy") and words in ready.stdout, ready.stdout
    assert "WARN" in ready.stdout and "FAIL" not in ready.stdout
    live = _run(tmp_path, python, scenario, "liveness")
    assert live.returncode == 0, live.stdout + live.stderr


def test_a_supported_field_that_errors_fails_readiness(tmp_path: Path, fake_nvml: Path,  # noqa: F811
                                                       make_interp: Callable[..., Interp]) -> None:
    done = _run(tmp_path, make_interp("py", mode="ok"), ["gpus 1", "gpu 0 field-error ecc 16"], "readiness")
    assert done.returncode == 1 and "FAIL nvml" in done.stdout, done.stdout


def test_driver_too_old_for_torch_names_both_versions(tmp_path: Path, fake_nvml: Path,  # noqa: F811
                                                      make_interp: Callable[..., Interp]) -> None:
    # torch only says "CUDA not available"; NVML says the driver supports CUDA 11.8, torch needs 12.1.
    done = _run(tmp_path, make_interp("py", mode="unavailable"), ["gpus 1", "cuda-driver 11080"], "readiness")
    assert done.returncode == 1, done.stdout
    first = done.stdout.splitlines()[0]
    assert "built for CUDA 12.1, driver supports CUDA 11.8" in first, done.stdout
    assert "forward-compatibility" in first and "newer NVIDIA driver" in first
