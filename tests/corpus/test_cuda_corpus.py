"""Real CUDA and PyTorch errors, as users pasted them in public threads, through the front door.

Each file in tests/corpus/cuda/ names its source (``# source:``) and the verdict the suite must
give (``# expect: reason=... latch=yes|no``), then holds the text verbatim. The real torch worker
runs in the real (CPU) torch, which sample_worker.py makes look like CUDA with one device and
which raises the sample where the worker's CUDA work happens (at start for ``# raise: init``);
``./healthcheck --only torch-cuda`` must then give the expected reason, and liveness must report
the latch exactly when the sample is a sticky error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import PYTHON, clean_env, run_cli

CORPUS = Path(__file__).resolve().parent / "cuda"
WRAPPER = Path(__file__).resolve().parent / "sample-python.sh"
SAMPLES = sorted(CORPUS.glob("*.txt"))
_FIELD = re.compile(r"# (\w+): (.*)")
WARNING_REASONS = ("oom", "device-busy", "mps-busy")


def fields(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        found = _FIELD.fullmatch(line)
        if not found:
            break
        out[found[1]] = found[2]
    return out


def sample_env(sample: Path, tmp_path: Path) -> dict[str, str]:
    """The front door's environment: the sample worker as the torch interpreter, no NVML."""
    return clean_env(HEALTHCHECK_TORCH_PYTHON=str(WRAPPER), CORPUS_SAMPLE=str(sample), CORPUS_TORCH_PYTHON=PYTHON,
                     HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_PYTHON=PYTHON,
                     ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false", LD_LIBRARY_PATH="")


def expected(path: Path) -> tuple[str, bool]:
    want = dict(part.split("=", 1) for part in fields(path)["expect"].split())
    return want["reason"], want["latch"] == "yes"


def test_every_sample_names_its_source_and_verdict() -> None:
    assert len(SAMPLES) >= 35
    for path in SAMPLES:
        head = fields(path)
        assert head.get("source", "").startswith("https://"), path.name
        reason, _ = expected(path)
        assert reason and set(head) <= {"source", "expect", "code", "type", "raise"}, path.name
        text = path.read_text(encoding="utf-8").splitlines()[len(head):]
        assert any(line.strip() for line in text), path.name


def test_the_corpus_covers_every_class_and_form() -> None:
    reasons = {expected(p)[0] for p in SAMPLES}
    assert {"cuda-fatal", "oom", "device-busy", "cuda-error", "fabric-manager", "driver-mismatch",
            "forward-compat", "driver-too-old", "cuda-unknown", "cuda-unavailable", "cuda-init"} <= reasons
    texts = [p.read_text(encoding="utf-8") for p in SAMPLES]
    assert sum("# code:" in t for t in texts) >= 5  # torch.AcceleratorError with error_code
    assert sum("cuda runtime error (" in t for t in texts) >= 5  # torch 1.x's numbered wording
    assert sum("TORCH_USE_CUDA_DSA" in t for t in texts) >= 10  # PyTorch 2.x's added line
    assert sum("# raise: init" in t for t in texts) >= 10


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_a_real_error_gets_its_verdict_through_the_front_door(sample: Path, tmp_path: Path) -> None:
    reason, latch = expected(sample)
    env = sample_env(sample, tmp_path)
    ran = run_cli("--only", "torch-cuda", "--json", env=env, front_door=True)
    check = json.loads(ran.stdout)["checks"]["torch-cuda:devices"][0]
    assert check.get("reason") == reason, f"{sample.name}: {check.get('output')}"
    warn = reason in WARNING_REASONS
    assert (ran.returncode, check["status"]) == ((0, "warn") if warn else (1, "fail")), check.get("output")
    live = run_cli("--profile", "liveness", "--only", "torch-cuda", "--json", env=env, front_door=True)
    live_check = json.loads(live.stdout)["checks"]["torch-cuda:devices"][0]
    assert (live.returncode, live_check.get("reason")) == ((1, "latched") if latch else (0, None)), live.stdout


def test_the_error_code_decides_through_the_front_door(tmp_path: Path) -> None:
    """torch.AcceleratorError's error_code reaches the suite from the real worker: a code that says
    device-side assert (710) latches even though the text says invalid argument."""
    sample = tmp_path / "code-wins.txt"
    sample.write_text("# code: 710\ntorch.AcceleratorError: CUDA error: invalid argument\n")
    env = sample_env(sample, tmp_path)
    ran = run_cli("--only", "torch-cuda", "--json", env=env, front_door=True)
    check = json.loads(ran.stdout)["checks"]["torch-cuda:devices"][0]
    assert (ran.returncode, check.get("reason")) == (1, "cuda-fatal"), check
    assert "cudaErrorAssert 710" in check["output"]
