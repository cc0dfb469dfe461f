"""`make gpu-verify` without a GPU: its help and usage errors, and the NVML reader it runs, on the
fake library. (The whole FAKE=1 self-test runs in .ci/run: about a minute.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, clean_env

HERE = ROOT / "tests" / "gpu"
VERIFY = HERE / "verify.sh"
FAKES = ROOT / "tests" / "fakes"


def test_help_is_the_header_and_touches_nothing(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(VERIFY), "--help"], capture_output=True, text=True, timeout=30,
                          check=False, cwd=tmp_path, env=clean_env(OUT=str(tmp_path / "out")))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Summary: ") and "\nUsage: " in done.stdout
    for word in ("FAKE=1", "OUT=", "skipped: needs a real GPU", "--system-site-packages", "--no-index"):
        assert word in done.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "env", "said"), [
    (["--bogus"], {}, "unknown argument '--bogus'"),
    (["--out"], {}, "--out needs a directory"),
    ([], {"FAKE": "maybe"}, "FAKE='maybe' is not accepted"),
])
def test_usage_errors_exit_3(tmp_path: Path, args: list[str], env: dict[str, str], said: str) -> None:
    done = subprocess.run(["bash", str(VERIFY), *args], capture_output=True, text=True, timeout=30, check=False,
                          env=clean_env(OUT=str(tmp_path / "out"), **env))
    assert done.returncode == 3
    assert done.stderr.startswith("gpu-verify: ") and said in done.stderr


@pytest.fixture(scope="module")
def fake_lib() -> Path:
    done = subprocess.run(["make", "-s", "-C", str(FAKES)], capture_output=True, text=True, check=False,
                          timeout=120)
    if done.returncode != 0:
        pytest.skip(f"cannot build the fake NVML library (make -C tests/fakes): {done.stderr[-300:]}")
    return FAKES / "build"


def read_fields(fake_lib: Path, tmp_path: Path, *lines: str) -> tuple[int, dict]:
    scenario = tmp_path / "scenario.txt"
    scenario.write_text("".join(line + "\n" for line in lines))
    done = subprocess.run([PYTHON, "-m", "tests.gpu.nvml_fields"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False,
                          env=clean_env(LD_LIBRARY_PATH=str(fake_lib), FAKE_NVML_SCENARIO=str(scenario)))
    return done.returncode, json.loads(done.stdout)


def test_nvml_fields_read_every_gpu_of_the_fake(fake_lib: Path, tmp_path: Path) -> None:
    rc, reading = read_fields(fake_lib, tmp_path, "gpus 2", "gpu 0 unsupported ecc", "gpu 0 unsupported remap",
                              "gpu 1 process 4242 100 python", "gpu 1 mig 2")
    assert rc == 0 and reading["problems"] == [] and reading["count"] == 2
    gpu0, gpu1 = reading["gpus"][:2]
    assert gpu0["nvmlDeviceGetTotalEccErrors"] == "error 3"  # NOT_SUPPORTED: allowed
    assert gpu1["process 4242"] == "python"
    assert gpu1["nvmlDeviceGetMigMode"][0] == 1 and "mig slot 6" in gpu1  # empty slots: NOT_FOUND, allowed
    assert reading["gpus"][2]["events"]["nvmlEventSetWait_v2"] == "error 10"  # TIMEOUT: allowed


def test_nvml_fields_name_an_unexpected_error(fake_lib: Path, tmp_path: Path) -> None:
    rc, reading = read_fields(fake_lib, tmp_path, "gpus 1", "gpu 0 query-error 999")
    assert rc == 1
    assert any("GPU 0: nvmlDeviceGetName: NVML error 999" in p for p in reading["problems"]), reading["problems"]
