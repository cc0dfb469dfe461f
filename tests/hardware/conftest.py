"""Fixtures for the hardware layer: the fake NVML library, stub nvidia-smi, scenarios, contexts.

The fake libnvidia-ml.so.1 is built once per session (``make -C tests/fakes``). For in-process
tests it is loaded by absolute path before nvidia-ml-py's first ``CDLL("libnvidia-ml.so.1")``,
which the dynamic loader then resolves by soname to the library already loaded; subprocess
tests get ``LD_LIBRARY_PATH`` instead.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from probes.config import Config
from probes.context import Context
from probes.state import State
from tests.conftest import ROOT, clean_env

FAKES = ROOT / "tests" / "fakes"
FAKE_LIB_DIR = FAKES / "build"


@pytest.fixture(scope="session")
def fake_nvml() -> Path:
    """Build the fake NVML library and load it into this process; returns its directory."""
    subprocess.run(["make", "-s", "-C", str(FAKES)], check=True, capture_output=True, timeout=120)
    lib = FAKE_LIB_DIR / "libnvidia-ml.so.1"
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return FAKE_LIB_DIR


@pytest.fixture
def stub_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty bin dir first on PATH (a stub nvidia-smi goes there)."""
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}/usr/bin{os.pathsep}/bin")
    return d


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """scenario("gpus 2", "gpu 1 lost") writes a scenario file and points FAKE_NVML_SCENARIO at it."""
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)

    def write(*lines: str) -> Path:
        path = tmp_path / "scenario.txt"
        path.write_text("".join(line + "\n" for line in lines))
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
        return path

    return write


def make_ctx(gpu_count: int = 2, budget: float = 5.0, results: dict | None = None) -> Context:
    return Context(Config(gpu_count=gpu_count), time.monotonic() + budget, results or {},
                   State.off("tests"))


@pytest.fixture
def ctx() -> Context:
    return make_ctx()


def cli_env(tmp_path: Path, *, stub_dir: Path | None = None, scenario_file: Path | None = None,
            **extra: str) -> dict[str, str]:
    """The environment of a whole `python -m probes` run against the fakes."""
    env = clean_env(**extra)
    env["PATH"] = os.pathsep.join(p for p in (str(stub_dir) if stub_dir else "", "/usr/bin", "/bin") if p)
    if "LD_LIBRARY_PATH" not in extra:  # a test passes "" to take the library away
        env["LD_LIBRARY_PATH"] = str(FAKE_LIB_DIR)
    env["HEALTHCHECK_STATE_DIR"] = str(tmp_path / "state")
    env.setdefault("HEALTHCHECK_GPU_COUNT", "2")
    if scenario_file is not None:
        env["FAKE_NVML_SCENARIO"] = str(scenario_file)
    return env


def assert_gone(pids: list[int], within: float = 2.0) -> None:
    """Every pid has exited (zombies awaiting their reaper count as gone)."""
    end = time.monotonic() + within
    alive = pids
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert not alive, f"processes left behind: {alive}"
