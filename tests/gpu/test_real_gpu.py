"""The CUDA paths on a real GPU, as `make gpu-verify` runs them (pytest -m gpu).

Skipped with a visible reason where nvidia-smi finds no GPU (the hook in tests/conftest.py);
the torch tests also skip where the torch interpreter (HEALTHCHECK_TORCH_PYTHON, else this
one) has no usable CUDA. Read-only: nothing here changes a GPU setting.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import clean_env, run_cli
from tests.gpu import nvml_fields

pytestmark = pytest.mark.gpu

TORCH_PY = os.environ.get("HEALTHCHECK_TORCH_PYTHON") or sys.executable
FACTS = """
import json, torch
ok = torch.cuda.is_available()
n = torch.cuda.device_count() if ok else 0
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "available": ok, "count": n,
                  "uuids": [str(getattr(torch.cuda.get_device_properties(i), "uuid", "")) for i in range(n)]}))
"""


@functools.lru_cache(maxsize=1)
def torch_facts() -> dict[str, Any]:
    done = subprocess.run([TORCH_PY, "-c", FACTS], capture_output=True, text=True, timeout=300, check=False)
    try:
        facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return facts


def cuda_torch() -> dict[str, Any]:
    """torch's facts, or skip: these tests need a real GPU that torch can use."""
    facts = torch_facts()
    if "error" in facts:
        pytest.skip(f"needs a real GPU and torch: {TORCH_PY} cannot import torch ({facts['error']})")
    if facts["cuda"] is None:
        pytest.skip(f"needs a real GPU: torch {facts['torch']} in {TORCH_PY} is a CPU-only build")
    if not facts["available"]:
        pytest.skip(f"needs a real GPU: torch.cuda.is_available() is False in {TORCH_PY}")
    return facts


def norm_uuid(uuid: str) -> str:
    text = uuid.lower()
    return text[4:] if text.startswith("gpu-") else text


def test_every_nvml_call_of_the_suite_answers_on_every_gpu() -> None:
    reading = nvml_fields.read_all()
    assert reading.count >= 1, "NVML sees no GPU"
    assert len([g for g in reading.gpus if "index" in g]) == reading.count
    assert not reading.problems, "unexpected NVML errors:\n" + "\n".join(reading.problems)


def test_cuda_driver_supports_torch_cuda() -> None:
    facts = cuda_torch()
    built = tuple(int(x) for x in str(facts["cuda"]).split(".")[:2])
    driver = nvml_fields.cuda_driver_version()
    assert driver >= built, (f"the driver supports CUDA {driver[0]}.{driver[1]} but torch {facts['torch']} "
                             f"was built for CUDA {facts['cuda']}: update the driver or use an older torch")


def test_torch_sees_the_gpus_nvml_sees() -> None:
    facts = cuda_torch()
    reading = nvml_fields.read_all()
    nvml = {norm_uuid(str(g.get("nvmlDeviceGetUUID", ""))) for g in reading.gpus if "index" in g}
    seen = [norm_uuid(u) for u in facts["uuids"]]
    assert facts["count"] >= 1
    # CUDA_VISIBLE_DEVICES may hide some from torch, never add one NVML does not know.
    assert set(seen) <= nvml, f"torch's GPUs {seen} are not among NVML's {sorted(nvml)}"


def test_torch_op_on_every_gpu_through_the_probe(tmp_path: Path) -> None:
    cuda_torch()
    count = nvml_fields.read_all().count
    state = tmp_path / "state"
    env = clean_env(HEALTHCHECK_TORCH_DEVICE="cuda", HEALTHCHECK_TORCH_PYTHON=TORCH_PY,
                    HEALTHCHECK_STATE_DIR=str(state), HEALTHCHECK_GPU_COUNT=str(count),
                    ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false")
    done = run_cli("--profile", "startup", "--json", env=env, timeout=240)
    report = json.loads(done.stdout)
    checks = {key.split(":")[0]: entries[0] for key, entries in report["checks"].items()}
    torch = checks["torch-cuda"]
    assert done.returncode == 0 and report["status"] in ("pass", "warn"), report["output"]
    assert torch["status"] == "pass", torch["output"]
    assert torch["observedValue"] == count, torch["output"]  # the op ran on every GPU
    assert checks["nvml"]["status"] in ("pass", "warn"), checks["nvml"]["output"]
