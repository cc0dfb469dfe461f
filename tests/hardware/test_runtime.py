"""The runtime probe through the CLI: a real tmpfs in a private mount namespace for /dev/shm, real
character device nodes (mknod) for /dev/nvidia*, the real environment, the fake NVML for persistence."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.hardware.conftest import cli_env

PROBES = [sys.executable, "-m", "probes"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    extra.setdefault("HEALTHCHECK_DEV_ROOT", str(dev))
    extra.setdefault("HEALTHCHECK_SHM_PATH", str(tmp_path))  # the test's own disk: large enough
    return cli_env(tmp_path, HEALTHCHECK_GPU_COUNT=extra.pop("HEALTHCHECK_GPU_COUNT", "1"), **extra)


def _run(env: dict[str, str], *args: str, argv: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv or [*PROBES, "--only", "runtime", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def _nodes(dev: Path, *names: str) -> None:
    for name in names:
        try:
            os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(195, 0))
        except PermissionError:
            pytest.skip("mknod of a character device is not permitted here (needs CAP_MKNOD)")


def _tmpfs_run(tmp_path: Path, size: str) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed: cannot mount a private tmpfs")
    shm = tmp_path / "shm"
    shm.mkdir()
    env = _env(tmp_path, HEALTHCHECK_SHM_PATH=str(shm))
    script = 'mount -t tmpfs -o size="$1" hc-test-shm "$2" && exec "$0" -m probes --only runtime'
    done = _run(env, argv=["unshare", "-m", "--propagation", "private", "sh", "-c", script, sys.executable, size,
                           str(shm)])
    if "mount" in done.stderr and done.returncode not in (0, 1):
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace: {done.stderr.strip()[:200]}")
    return done


def test_64_mib_shm_warns_with_the_remedy(tmp_path):
    done = _tmpfs_run(tmp_path, "64m")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARN runtime" in done.stdout and "is 64 MiB (below 1024 MiB)" in done.stdout
    assert "--shm-size" in done.stdout and "--ipc=host" in done.stdout and "emptyDir" in done.stdout


def test_2_gib_shm_passes(tmp_path):
    done = _tmpfs_run(tmp_path, "2g")
    assert done.returncode == 0 and "PASS runtime" in done.stdout and "2048 MiB" in done.stdout, done.stdout


def test_missing_uvm_node_fails_when_the_container_has_gpus(tmp_path):
    env = _env(tmp_path, NVIDIA_VISIBLE_DEVICES="all")
    _nodes(tmp_path / "dev", "nvidiactl", "nvidia0")
    done = _run(env)
    assert done.returncode == 1 and "FAIL runtime" in done.stdout, done.stdout
    assert "nvidia-uvm" in done.stdout and "nvidia-modprobe -u" in done.stdout
    _nodes(tmp_path / "dev", "nvidia-uvm")
    done = _run(env)
    assert done.returncode == 0 and "PASS runtime" in done.stdout and "1 GPU(s)" in done.stdout, done.stdout


def test_one_gpu_node_per_expected_gpu(tmp_path):
    env = _env(tmp_path, HEALTHCHECK_GPU_COUNT="2")
    _nodes(tmp_path / "dev", "nvidiactl", "nvidia-uvm", "nvidia0")
    done = _run(env)
    assert done.returncode == 1 and "(1 of 2)" in done.stdout, done.stdout


def test_no_gpu_given_is_not_judged_here(tmp_path):
    done = _run(_env(tmp_path))
    assert done.returncode == 0 and "device nodes not judged" in done.stdout, done.stdout


@pytest.mark.parametrize("var", ["CUDA_LAUNCH_BLOCKING", "CUDA_INJECTION64_PATH",
                                 "CUDA_ENABLE_COREDUMP_ON_EXCEPTION"])
def test_cuda_debugging_variables_warn_by_name(tmp_path, var):
    done = _run(_env(tmp_path, **{var: "1"}))
    assert done.returncode == 0 and "WARN runtime" in done.stdout and f"{var}='1' is set" in done.stdout
    assert _run(_env(tmp_path, CUDA_LAUNCH_BLOCKING="0")).stdout.count("PASS runtime") == 1


def test_persistence_off_warns_in_startup_only(tmp_path, fake_nvml):
    scenario = tmp_path / "scenario.txt"
    scenario.write_text("gpus 1\ngpu 0 persistence 0\n")
    env = _env(tmp_path, FAKE_NVML_SCENARIO=str(scenario))
    done = _run(env, argv=[*PROBES, "--profile", "startup", "--only", "nvml,runtime"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARN runtime" in done.stdout and "persistence mode is off on GPU 0" in done.stdout
    done = _run(env, argv=[*PROBES, "--profile", "readiness", "--only", "nvml,runtime"])
    assert done.returncode == 0 and "PASS runtime" in done.stdout, done.stdout
