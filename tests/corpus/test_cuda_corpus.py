"""Real CUDA and PyTorch errors, as users pasted them in public threads, through the torch worker,
its result line's parser and the judge.

Each file in tests/corpus/cuda/ names its source (``# source:``) and the verdict the suite must
give (``# expect: reason=... latch=yes|no``), then holds the text verbatim. sample_worker.py makes
the real (CPU) torch look like CUDA with one device and raises the sample where the worker's CUDA
work happens (at start for ``# raise: init``). Every sample runs in this process: the worker's own
``work()``, its result line through ``deep.parse`` and ``validate``, ``judge``, and the record that
latches; the latch must be kept exactly when the sample is a sticky error. A few, one per path
(an error code, an error at start, torch's out-of-memory class, a text alone), also go through the
front door in a real worker process: exit status, first line, the latch liveness reports, and no
process left behind.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from probes.config import load
from probes.context import Context
from probes.framework import deep, torch_cuda, torch_worker
from probes.result import Status
from probes.state import State
from tests.conftest import PYTHON, clean_env, run_cli
from tests.corpus import sample_worker

CORPUS = Path(__file__).resolve().parent / "cuda"
WRAPPER = Path(__file__).resolve().parent / "sample-python.sh"
SAMPLES = sorted(CORPUS.glob("*.txt"))
WARNING_REASONS = ("oom", "device-busy", "mps-busy")
SIZE = 16  # the worker's reference matmul: its size changes nothing about an error


def expected(path: Path) -> tuple[str, bool]:
    fields, _ = sample_worker.read(str(path))
    want = dict(part.split("=", 1) for part in fields["expect"].split())
    return want["reason"], want["latch"] == "yes"


def test_every_sample_names_its_source_and_verdict() -> None:
    assert len(SAMPLES) >= 35
    for path in SAMPLES:
        head, text = sample_worker.read(str(path))
        assert head.get("source", "").startswith("https://"), path.name
        reason, _ = expected(path)
        assert reason and set(head) <= {"source", "expect", "code", "type", "raise"}, path.name
        assert text.strip(), path.name


def test_the_corpus_covers_every_class_and_form() -> None:
    reasons = {expected(p)[0] for p in SAMPLES}
    assert {"cuda-fatal", "oom", "device-busy", "cuda-error", "fabric-manager", "driver-mismatch",
            "forward-compat", "driver-too-old", "cuda-unknown", "cuda-unavailable", "cuda-init"} <= reasons
    texts = [p.read_text(encoding="utf-8") for p in SAMPLES]
    assert sum("# code:" in t for t in texts) >= 5  # torch.AcceleratorError with error_code
    assert sum("cuda runtime error (" in t for t in texts) >= 5  # torch 1.x's numbered wording
    assert sum("TORCH_USE_CUDA_DSA" in t for t in texts) >= 10  # PyTorch 2.x's added line
    assert sum("# raise: init" in t for t in texts) >= 10


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


def worker_line(torch: Any, sample: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The result line the real worker prints when it meets ``sample``, run in this process."""
    fields, text = sample_worker.read(str(sample))
    sample_worker.install(torch, fields, sample_worker.exception(torch, fields, text), monkeypatch.setattr)
    report = torch_worker.new_report(torch_worker.parse_args(["--device", "cuda", "--size", str(SIZE)]))
    torch_worker.work(torch_worker.parse_args(["--device", "cuda", "--size", str(SIZE)]), report)
    return (torch_worker.PREFIX + json.dumps(report, sort_keys=True) + "\n").encode()


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_a_real_error_gets_its_verdict_and_latches_only_when_sticky(
        sample: Path, torch: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reason, latch = expected(sample)
    report, problem = deep.parse(worker_line(torch, sample, monkeypatch), torch_worker.PREFIX,
                                 lambda report: torch_cuda.validate(report, "cuda", SIZE))
    assert problem is None, problem
    data = {"kind": "worker", "spawn_error": None, "returncode": 0, "timed_out": False, "lingered": False,
            "stuck": False, "held_by": None, "budget": 30.0, "phase": None, "memory": False, "report": report,
            "problem": None, "finished": time.time(), "cache": None, "room": None, "python": PYTHON,
            "device": "cuda", "expect": None, "elapsed": 1.0, "excerpt": None}
    state = State.open(str(tmp_path / "state"))
    ctx = Context(load({}), time.monotonic() + 30, {}, state)
    deep.record(ctx, torch_cuda.CACHE, {"sample": sample.name}, data, torch_cuda.judge)
    result = torch_cuda.judge(data, ctx)
    assert result.reason == reason, f"{sample.name}: {result.message}"
    assert result.status is (Status.WARN if reason in WARNING_REASONS else Status.FAIL), result.message
    assert (state.latch() is not None) == latch, result.message


# One sample per path through the real worker process: (sample, exit status, first line's start).
CODE_WINS = "# code: 710\ntorch.AcceleratorError: CUDA error: invalid argument\n"
FRONT_DOOR = [
    # torch.AcceleratorError's error_code crosses the process boundary: 710 (device-side assert) wins
    # over a text that says invalid argument, and latches.
    (None, 1, "unhealthy: torch-cuda: fatal CUDA error on cuda:0 (cudaErrorAssert 710"),
    ("system-not-ready-h200", 1, "unhealthy: torch-cuda: CUDA cannot start on the GPU(s) "
                                 "(cudaErrorSystemNotReady 802"),
    ("oom-new-wording", 0, "healthy with warnings: torch-cuda: cuda:0 out of memory"),
    ("no-kernel-image-full-tail", 1, "unhealthy: torch-cuda: CUDA error on cuda:0 "
                                     "(cudaErrorNoKernelImageForDevice 209"),
]


def marked(mark: str) -> list[str]:
    """Live processes whose environment carries ``mark``: what a run left behind."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and p.environ().get("HC_CORPUS") == mark:
                found.append(" ".join(p.cmdline()))
        except (psutil.Error, OSError):
            continue
    return found


@pytest.mark.parametrize(("name", "code", "first"), FRONT_DOOR, ids=[n or "code-wins" for n, _, _ in FRONT_DOOR])
def test_a_real_error_through_the_front_door(name: str | None, code: int, first: str, tmp_path: Path) -> None:
    sample = tmp_path / "sample.txt"
    sample.write_text(CODE_WINS if name is None else (CORPUS / f"{name}.txt").read_text(encoding="utf-8"))
    latch = name is None or expected(CORPUS / f"{name}.txt")[1]
    mark = uuid.uuid4().hex
    env = clean_env(HEALTHCHECK_TORCH_PYTHON=str(WRAPPER), CORPUS_SAMPLE=str(sample), CORPUS_TORCH_PYTHON=PYTHON,
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_PYTHON=PYTHON, HC_CORPUS=mark,
                    ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false", LD_LIBRARY_PATH="")
    ran = run_cli("--only", "torch-cuda", env=env, front_door=True)
    assert ran.returncode == code and ran.stdout.startswith(first), ran.stdout + ran.stderr
    live = run_cli("--profile", "liveness", "--only", "torch-cuda", env=env, front_door=True)
    assert (live.returncode, "latched" in live.stdout.splitlines()[0]) == (int(latch), latch), live.stdout
    assert marked(mark) == []
    left = sorted(os.listdir(tmp_path / "state"))  # the cache and the lock, the latch when sticky; nothing else
    assert left == sorted(["torch-cuda.json", "torch-cuda.lock", *(["latch.json"] if latch else [])])
