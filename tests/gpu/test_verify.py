"""`make gpu-verify` without a GPU: what its scripts may never do, its help and usage errors,
and the NVML call list it checks. (The whole FAKE=1 self-test runs in .ci/run: about a minute.)
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, clean_env
from tests.gpu import nvml_fields

HERE = ROOT / "tests" / "gpu"
VERIFY = HERE / "verify.sh"
FAKES = ROOT / "tests" / "fakes"
# Everything make gpu-verify runs (not the tests themselves).
SCRIPTS = sorted(p for p in HERE.iterdir() if p.suffix in (".sh", ".py") and not p.name.startswith("test_"))
# nvidia-smi may only be asked to list or query; every other flag changes or resets something.
SMI_ALLOWED = ("--query-gpu=", "--format=")
# NVML calls that change a GPU: setters, resets, clears, MIG instance management.
NVML_WRITES = re.compile(r"nvml(Device|System|Unit|GpuInstance|ComputeInstance|Vgpu)\w*"
                         r"(Set|Reset|Clear|Create|Destroy)\w*")
# The script a reader checks first: no network client, no GPU setting, in any spelling.
VERIFY_FORBIDDEN = ("nvidia-smi -pm", "nvidia-smi -c ", "nvidia-smi -r", "--lock-gpu-clocks", "-lgc", "-mig",
                    "--persistence-mode", "--compute-mode", "--gpu-reset", "pip download", "curl", "wget",
                    "http", "modprobe", "sudo")


def test_scripts_are_found() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"verify.sh", "verify.py", "verify_core.py", "verify_runs.py", "verify_faults.py", "verify_serve.py",
            "verify_timings.py", "fault-python.sh", "fault_worker.py", "hold_memory.py",
            "nvml_fields.py"} <= names


def test_verify_sh_shows_no_network_access_and_no_gpu_setting() -> None:
    text = VERIFY.read_text().lower()
    found = [word for word in VERIFY_FORBIDDEN if word.lower() in text]
    assert not found, f"{VERIFY.name} contains {found}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_nvidia_smi_is_only_queried(script: Path) -> None:
    for number, line in enumerate(script.read_text().splitlines(), 1):
        for tail in re.findall(r"nvidia-smi(.*)", line):
            flags = [t.strip("\"'(),[]") for t in re.split(r"[\s,]+", tail) if t.strip("\"'(),[]").startswith("-")]
            bad = [f for f in flags if f != "-L" and not f.startswith(SMI_ALLOWED)]
            assert not bad, f"{script.name}:{number}: nvidia-smi {bad}: {line.strip()}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_gpu_setting_no_download_no_remote_host(script: Path) -> None:
    text = script.read_text()
    assert not NVML_WRITES.findall(text), f"{script.name} calls an NVML setter"
    for word in ("pip download", "curl", "wget", "urlopen", "urllib", "requests.", "create_connection",
                 "modprobe", "sudo ", "://127", "https://"):
        assert word not in text, f"{script.name} contains {word!r}"
    # The one server talked to is the local serve started by verify.py.
    calls = re.findall(r"HTTPConnection\(([^,)]*)", text)
    assert all(arg.strip() == "LOOPBACK" for arg in calls), calls
    if calls:
        assert 'LOOPBACK = "127.0.0.1"' in text


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


def test_nvml_calls_cover_every_call_of_the_suite() -> None:
    used = set()
    for path in (ROOT / "probes").rglob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r"\bnv\.(nvml[A-Z]\w+)", text))
        used |= set(re.findall(r"[\"'](nvml[A-Z]\w+)[\"']", text))
    assert used, "no NVML call found in probes/: has the code moved?"
    # nvml_lib only checks that this exists, to tell NVIDIA's bindings from the old pynvml package.
    used.discard("nvmlInitWithFlags")
    missing = sorted(used - nvml_fields.CALLS)
    assert not missing, f"add these to tests/gpu/nvml_fields.py (CALLS and read_all): {missing}"


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
