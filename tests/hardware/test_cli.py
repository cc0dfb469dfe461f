"""Whole runs of `python -m probes --only nvidia-smi,nvml` against the stub nvidia-smi and the fake NVML."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import ROOT
from tests.fakes.nvidia_smi_stub import started_pids, write_stub
from tests.hardware.conftest import assert_gone, cli_env


@pytest.fixture
def run(fake_nvml, tmp_path):
    """run(stub behaviour, scenario lines, *args, **env) -> (CompletedProcess, seconds)."""
    stub_dir = tmp_path / "bin"

    def go(behaviour: str | None, lines: list[str], *args: str, stub_kw: dict | None = None, **env: str):
        stub_dir.mkdir(exist_ok=True)
        if behaviour:
            write_stub(stub_dir, behaviour, **(stub_kw or {}))
        sc = tmp_path / "scenario.txt"
        sc.write_text("".join(f"{line}\n" for line in lines))
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "probes", "--only", "nvidia-smi,nvml", *args],
                           env=cli_env(tmp_path, stub_dir=stub_dir, scenario_file=sc, **env), cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=False)
        return p, time.monotonic() - t0

    go.stub_dir = stub_dir  # type: ignore[attr-defined]
    return go


def checks(p: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    doc = json.loads(p.stdout)
    return {k.split(":")[0]: v[0] for k, v in doc["checks"].items()}


def test_healthy_pair_passes_both_probes(run):
    p, _ = run("ok", ["gpus 2"], "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    c = checks(p)
    assert c["nvidia-smi"]["status"] == "pass" and c["nvidia-smi"]["observedValue"] == 2
    assert c["nvml"]["status"] == "pass" and c["nvml"]["observedValue"] == 2
    assert "Traceback" not in p.stderr


def test_lost_gpu_is_reported_by_both_while_the_other_still_reports(run):
    p, _ = run("lost", ["gpus 2", "gpu 1 lost"])
    assert p.returncode == 1
    lines = p.stdout.splitlines()
    smi = next(line for line in lines if line.startswith("FAIL nvidia-smi"))
    nv = next(line for line in lines if line.startswith("FAIL nvml"))
    assert "is lost" in smi and "1 GPU still reported" in smi
    assert "GPU 1 is lost" in nv and "1 other GPU still reports" in nv
    assert len(p.stdout.encode()) < 4096


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None,
                    reason="a real libnvidia-ml is installed on this machine")
def test_no_driver_at_all(run, tmp_path):
    p, _ = run(None, [], "--json", LD_LIBRARY_PATH="")
    assert p.returncode == 1
    c = checks(p)
    assert c["nvidia-smi"]["reason"] == "not-found"
    assert c["nvml"]["reason"] == "nvml-not-found"
    assert "--gpus all" in c["nvidia-smi"]["output"] and "HINT" in c["nvml"]["output"]


@pytest.mark.parametrize("hang", ["hang nvmlDeviceGetCount_v2", "hang nvmlInit"])
def test_hangs_return_at_the_deadline_and_leave_no_process(run, hang):
    # Servers that other tests' session fixtures started are our children too: only
    # processes that appeared during this run count as left behind.
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    p, took = run("ignore-term", ["gpus 2", hang], "--json", stub_kw={"sleep": 30}, HEALTHCHECK_TIMEOUT="2")
    assert took < 2.0 + 0.5 + 1.0  # the deadline, its margin, and the interpreter's start
    assert p.returncode == 1, p.stdout + p.stderr
    c = checks(p)
    assert c["nvidia-smi"]["reason"] == "deadline"
    assert c["nvml"]["reason"] == "deadline" and "Xid" in c["nvml"]["output"]
    assert_gone(started_pids(run.stub_dir))
    assert [c for c in psutil.Process().children(recursive=True) if c.pid not in before] == []


def test_shadowing_pynvml_is_named(run, tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text("def nvmlInit():\n    pass\n")  # the deprecated package's shape
    p, _ = run("ok", ["gpus 2"], "--json", PYTHONPATH=str(shadow))
    assert p.returncode == 1
    c = checks(p)
    assert c["nvml"]["reason"] == "nvml-bindings-shadowed" and "nvidia-ml-py" in c["nvml"]["output"]
    assert c["nvidia-smi"]["status"] == "pass"


def test_control_characters_in_nvml_names_are_made_visible(run):
    name = "NVIDIA\x1b[2J\x07 H100"
    for args in ((), ("--json",)):
        p, _ = run("ok", ["gpus 2", f"gpu 0 name {name}", "gpu 1 name " + name, "gpu 1 lost"], *args)
        assert p.returncode == 1
        assert "\x1b" not in p.stdout and "\x07" not in p.stdout, p.stdout
    import subprocess as sp

    from tests.conftest import ROOT
    from tests.hardware.conftest import cli_env

    sc = run.stub_dir.parent / "scenario.txt"
    sc.write_text(f"gpus 1\ngpu 0 name {name}\n")
    script = ("import json, time\nfrom probes.config import Config\nfrom probes.context import Context\n"
              "from probes.hardware import nvml\nfrom probes.state import State\n"
              "ctx = Context(Config(gpu_count=1), time.monotonic() + 5, {}, State.off('t'))\n"
              "print(json.dumps(nvml.judge(nvml.gather(ctx), ctx).facts['gpus'][0]['name']))\n")
    res = sp.run([sys.executable, "-c", script], env=cli_env(run.stub_dir.parent, scenario_file=sc), cwd=ROOT,
                 capture_output=True, text=True, timeout=60, check=False)
    assert json.loads(res.stdout) == "NVIDIA\\x1b[2J\\x07 H100", res.stdout + res.stderr
