"""The checkpoint probe against a fake libcuda.so.1 (tests/fakes/fake_cuda.c), loaded by the
probe's child exactly as the real driver is: ctypes.CDLL("libcuda.so.1") through LD_LIBRARY_PATH."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from probes.config import Config
from probes.context import Context
from probes.framework import checkpoint, checkpoint_child, model
from probes.result import Result, Status, passed
from probes.state import LATCH, State
from tests.conftest import ROOT, clean_env, run_cli

FAKES = ROOT / "tests" / "fakes"


@pytest.fixture(scope="session")
def fake_cuda() -> Path:
    """Build the fake driver (both variants) and the fake NVML that whole runs use, once; returns
    the build directory."""
    subprocess.run(["make", "-s", "-C", str(FAKES), "-f", "cuda.mk"], check=True, capture_output=True,
                   timeout=120)
    subprocess.run(["make", "-s", "-C", str(FAKES)], check=True, capture_output=True, timeout=120)
    return FAKES / "build"


@pytest.fixture
def driver(fake_cuda: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """driver("pid 12 locked", old=False): writes the scenario and puts that driver on LD_LIBRARY_PATH."""

    def use(*lines: str, old: bool = False) -> Path:
        path = tmp_path / "cuda-scenario.txt"
        path.write_text("".join(line + "\n" for line in lines))
        monkeypatch.setenv("FAKE_CUDA_SCENARIO", str(path))
        monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_cuda / ("cuda-old" if old else "cuda")))
        return path

    return use


@pytest.fixture
def workload() -> Iterator[list[int]]:
    """Two real processes standing in for CUDA applications of this container."""
    procs = [subprocess.Popen(["sleep", "120"]) for _ in range(2)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def nvml_seen(*pids: int) -> Result:
    """What the nvml probe reports of NVML's compute processes (its facts, as the runner passes them)."""
    return passed("nvml", "ok", facts={"gpus": [{"index": 0, "processes": [{"pid": p, "name": "python3"}
                                                                              for p in pids]}]})


def run_probe(tmp_path: Path, *pids: int, timeout: float = 10.0,
              profile: str = "readiness") -> tuple[Result, dict[str, Any], float]:
    cfg = Config()._replace(profile=profile)
    ctx = Context(cfg, time.monotonic() + timeout, {"nvml": nvml_seen(*pids)},
                  State.open(str(tmp_path / "state")))
    start = time.monotonic()
    data = checkpoint.gather(ctx)
    return checkpoint.judge(data, ctx), data, time.monotonic() - start


def test_running_processes_pass(tmp_path: Path, driver: Any, workload: list[int]) -> None:
    a, b = workload
    driver(f"pid {a} running", f"pid {b} running")
    result, data, _ = run_probe(tmp_path, a, b)
    assert result.status is Status.PASS, result.message
    assert data["pids"] == sorted([a, b]) and result.observed == 2
    assert "CUDA 12.8" in result.message


@pytest.mark.parametrize("state, words", [("locked", "CUDA-locked for a checkpoint"),
                                          ("checkpointed", "CUDA-checkpointed")])
def test_locked_or_checkpointed_fails_readiness_without_latching(tmp_path: Path, driver: Any,
                                                                 workload: list[int], state: str,
                                                                 words: str) -> None:
    a, b = workload
    driver(f"pid {a} running", f"pid {b} {state}")
    result, _, _ = run_probe(tmp_path, a, b)
    assert result.status is Status.FAIL and result.reason == "checkpointed"
    assert result.message == f"process {b} is {words}: traffic paused until it is restored"
    assert not (tmp_path / "state" / LATCH).exists()


def test_failed_checkpoint_fails_with_the_remedy(tmp_path: Path, driver: Any, workload: list[int]) -> None:
    a, _ = workload
    driver(f"pid {a} failed")
    result, _, _ = run_probe(tmp_path, a)
    assert result.status is Status.FAIL and result.reason == "checkpoint-failed"
    assert f"cuda-checkpoint --toggle --pid {a}" in result.message


def test_driver_without_the_api_is_not_judged(tmp_path: Path, driver: Any, workload: list[int]) -> None:
    a, _ = workload
    driver(f"pid {a} checkpointed", "driver 12040", old=True)
    result, _, _ = run_probe(tmp_path, a)
    assert result.status is Status.PASS and result.reason == "no-checkpoint-api", result.message
    assert "CUDA 12.4" in result.message


def test_no_driver_at_all_is_not_judged(tmp_path: Path, workload: list[int], monkeypatch: Any) -> None:
    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a real libcuda.so.1 in the system paths")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "empty"))
    result, _, _ = run_probe(tmp_path, workload[0])
    assert result.status is Status.PASS and result.reason == "no-checkpoint-api"
    assert "no libcuda.so.1" in result.message


def test_a_query_that_hangs_ends_by_the_deadline(tmp_path: Path, driver: Any, workload: list[int],
                                                 marker: Any) -> None:
    a, _ = workload
    driver(f"pid {a} running", "hang")
    result, data, took = run_probe(tmp_path, a, timeout=2.0)
    assert took < 6, took
    assert result.status is Status.FAIL and result.reason == "query-hang", result.message
    assert data["asked"] == a and str(a) in result.message
    assert marker() == []


def test_processes_nvml_does_not_report_are_not_asked(tmp_path: Path, driver: Any,
                                                      workload: list[int]) -> None:
    a, b = workload
    driver(f"pid {a} running", f"pid {b} checkpointed")
    result, data, _ = run_probe(tmp_path, a)
    assert result.status is Status.PASS and data["pids"] == [a]
    result, data, _ = run_probe(tmp_path)  # nothing holds a CUDA context: no child at all
    assert result.status is Status.PASS and data == {"kind": "none"}


def test_gpu_work_waits_while_a_process_is_checkpointed(tmp_path: Path, driver: Any, workload: list[int],
                                                        make_interp: Any) -> None:
    a, _ = workload
    driver(f"pid {a} checkpointed")
    result, _, _ = run_probe(tmp_path, a)
    assert result.reason == "checkpointed"
    interp = make_interp("py")
    state = State.open(str(tmp_path / "state"))
    cfg = Config()._replace(torch_python=str(interp), torch_device="cpu", model_path=str(tmp_path / "m.pt"))
    # in the same run (the runner passes the checkpoint result) and in a later run (the marker)
    for results in ({"checkpoint": result}, {}):
        ctx = Context(cfg, time.monotonic() + 10, results, state)
        held = model.judge(model.gather(ctx), ctx)
        assert held.status is Status.SKIP and held.reason == "checkpointed", held.message
    assert interp.starts == 0
    # restored: the next look clears the marker and GPU work may start again
    driver(f"pid {a} running")
    assert run_probe(tmp_path, a)[0].status is Status.PASS
    ctx = Context(cfg, time.monotonic() + 10, {}, state)
    assert checkpoint.hold(ctx) is None


def test_marker_of_an_ended_process_holds_nothing(tmp_path: Path, driver: Any) -> None:
    proc = subprocess.Popen(["sleep", "120"])
    driver(f"pid {proc.pid} locked")
    assert run_probe(tmp_path, proc.pid)[0].reason == "checkpointed"
    state = State.open(str(tmp_path / "state"))
    ctx = Context(Config(), time.monotonic() + 5, {}, state)
    assert checkpoint.hold(ctx) is not None
    proc.kill()
    proc.wait()
    assert checkpoint.hold(ctx) is None


def test_child_output_is_validated() -> None:
    good = {"v": 1, "loaded": True, "driver": 12080, "api": True, "init": 0,
            "states": [{"pid": 5, "rc": 0, "state": 2}]}
    line = (checkpoint_child.PREFIX + json.dumps(good) + "\n").encode()
    assert checkpoint.parse_output(line) is not None
    for bad in ({**good, "api": 1}, {**good, "states": [{"pid": "5", "rc": 0, "state": 2}]},
                {**good, "extra": 0}):
        assert checkpoint.parse_output((checkpoint_child.PREFIX + json.dumps(bad) + "\n").encode()) is None


def test_whole_runs_readiness_fails_liveness_passes(tmp_path: Path, fake_cuda: Path,
                                                    workload: list[int]) -> None:
    """End to end: the real nvml probe over the fake NVML names the process, the child asks the fake
    driver; readiness fails with the reason, liveness passes, and no latch is left."""
    a, _ = workload
    (tmp_path / "nvml.txt").write_text(f"gpus 1\ngpu 0 process {a} 2048 python3\n")
    (tmp_path / "cuda.txt").write_text(f"pid {a} checkpointed\n")
    env = clean_env(LD_LIBRARY_PATH=f"{FAKES / 'build'}:{fake_cuda / 'cuda'}",
                    FAKE_NVML_SCENARIO=str(tmp_path / "nvml.txt"), FAKE_CUDA_SCENARIO=str(tmp_path / "cuda.txt"),
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), ENABLE_CHECKPOINT_CHECK="true")
    ready = run_cli("--profile", "readiness", "--only", "nvml,checkpoint", env=env)
    assert ready.returncode == 1, ready.stdout + ready.stderr
    assert f"process {a} is CUDA-checkpointed: traffic paused until it is restored" in ready.stdout
    live = run_cli("--profile", "liveness", "--only", "checkpoint,torch-cuda", env=env)
    assert live.returncode == 0, live.stdout + live.stderr
    assert not (tmp_path / "state" / LATCH).exists()
    (tmp_path / "cuda.txt").write_text(f"pid {a} running\n")
    again = run_cli("--profile", "readiness", "--only", "nvml,checkpoint", env=env)
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.parametrize("old, checkpointed", [(True, True), (False, False), (False, True)])
def test_model_waits_for_the_checkpoint_probe_in_a_whole_run(tmp_path: Path, fake_cuda: Path,
                                                             workload: list[int], old: bool,
                                                             checkpointed: bool) -> None:
    """A driver without the API holds nothing back; a checkpointed process keeps the model worker
    from starting (the model line is skipped, naming the process)."""
    import torch

    a, _ = workload
    torch.save({"w": torch.ones(3)}, str(tmp_path / "m.pt"))
    (tmp_path / "nvml.txt").write_text(f"gpus 1\ngpu 0 process {a} 2048 python3\n")
    (tmp_path / "cuda.txt").write_text(f"pid {a} {'checkpointed' if checkpointed else 'running'}\n")
    env = clean_env(LD_LIBRARY_PATH=f"{FAKES / 'build'}:{fake_cuda / ('cuda-old' if old else 'cuda')}",
                    FAKE_NVML_SCENARIO=str(tmp_path / "nvml.txt"), FAKE_CUDA_SCENARIO=str(tmp_path / "cuda.txt"),
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_TORCH_DEVICE="cpu",
                    HEALTHCHECK_TORCH_PYTHON=sys.executable, HEALTHCHECK_MODEL_PATH=str(tmp_path / "m.pt"))
    res = run_cli("--profile", "readiness", "--only", "nvml,checkpoint,model", "--json", env=env)
    doc = json.loads(res.stdout)
    if checkpointed and not old:
        # skipped: it observed nothing (health+json lists it under "skipped", not "checks")
        assert res.returncode == 1, res.stdout
        assert not any(k.startswith("model:") for k in doc["checks"])
        skipped = next(v for k, v in doc["skipped"].items() if k.startswith("model"))
        assert f"process {a} is CUDA-checkpointed" in skipped["output"], skipped
    else:
        model_check = next(v[0] for k, v in doc["checks"].items() if k.startswith("model:"))
        assert res.returncode == 0, res.stdout + res.stderr
        assert model_check["status"] == "pass", res.stdout


@pytest.mark.parametrize("checkpointed", [True, False])
def test_torch_cuda_starts_no_worker_while_a_process_is_checkpointed(tmp_path: Path, fake_cuda: Path,
                                                                     workload: list[int], checkpointed: bool) -> None:
    """On the GPU the torch op waits for the checkpoint probe: a checkpointed process means no worker."""
    a, _ = workload
    started = tmp_path / "started"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\necho started >> {started}\nexit 0\n")
    wrapper.chmod(0o755)
    (tmp_path / "nvml.txt").write_text(f"gpus 1\ngpu 0 process {a} 2048 python3\n")
    (tmp_path / "cuda.txt").write_text(f"pid {a} {'checkpointed' if checkpointed else 'running'}\n")
    env = clean_env(LD_LIBRARY_PATH=f"{FAKES / 'build'}:{fake_cuda / 'cuda'}",
                    FAKE_NVML_SCENARIO=str(tmp_path / "nvml.txt"), FAKE_CUDA_SCENARIO=str(tmp_path / "cuda.txt"),
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_TORCH_DEVICE="cuda",
                    HEALTHCHECK_TORCH_PYTHON=str(wrapper))
    res = run_cli("--profile", "readiness", "--only", "nvml,checkpoint,torch-cuda", env=env)
    torch_line = next(line for line in res.stdout.splitlines() if " torch-cuda " in line)
    if checkpointed:
        assert torch_line.startswith("SKIP torch-cuda") and f"process {a} is CUDA-checkpointed" in torch_line
        assert not started.exists()
    else:
        assert started.exists(), res.stdout
