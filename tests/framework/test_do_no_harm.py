"""Do no harm: a GPU whose memory the workload holds gets no CUDA context from the suite.

Through the CLI against the fake NVML (whose ``gpu I memory TOTAL USED`` line sets what NVML
reports free) and the torch-cuda worker in a fake torch interpreter that records the
CUDA_VISIBLE_DEVICES it was given; the survey itself in this process, on the same fake.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from probes.framework import deep
from tests.conftest import ROOT
from tests.framework.conftest import REAL_PYTHON, Interp
from tests.hardware.conftest import cli_env, fake_nvml  # noqa: F401  (the fixture)
from tests.hardware.conftest import scenario as scenario_file  # noqa: F401  (the fixture)

UUIDS = ("GPU-11111111-fake-4000-8000-000000000000", "GPU-22222222-fake-4000-8000-000000000001")


def scenario(*lines: str, gpus: int = 1) -> list[str]:
    return [f"gpus {gpus}", *(f"gpu {i} uuid {UUIDS[i]}" for i in range(gpus)), *lines]


def interp(make_interp: Callable[..., Interp], tmp_path: Path, count: int = 1) -> tuple[Interp, Path]:
    """A fake torch interpreter that writes down the CUDA_VISIBLE_DEVICES it was started with."""
    seen = tmp_path / "visible"
    python = make_interp("py", mode="ok", exports={"FAKE_TORCH_COUNT": str(count)},
                         body=f'echo "${{CUDA_VISIBLE_DEVICES-unset}}" >> "{seen}"; exec "{REAL_PYTHON}" "$@"')
    return python, seen


def run(tmp_path: Path, python: Interp, lines: list[str], profile: str = "readiness",
        **extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    path = tmp_path / "scenario.txt"
    path.write_text("".join(line + "\n" for line in lines))
    # The hardware probes are off: torch-cuda reads NVML itself before it starts its worker.
    env = cli_env(tmp_path, scenario_file=path, HEALTHCHECK_TORCH_PYTHON=str(python),
                  ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false", ENABLE_GPU_CHECK="false", **extra)
    done = subprocess.run([sys.executable, "-m", "probes", "--profile", profile, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90)
    return done, json.loads(done.stdout)["checks"]["torch-cuda:devices"][0]


def test_a_full_gpu_gets_no_context_and_a_warning(tmp_path: Path, fake_nvml: Path,  # noqa: F811
                                                  make_interp: Callable[..., Interp]) -> None:
    python, _ = interp(make_interp, tmp_path)
    done, check = run(tmp_path, python, scenario("gpu 0 memory 81559 81000"))
    assert (done.returncode, check["status"], check["reason"]) == (0, "warn", "workload-memory"), check
    assert check["output"].startswith("not checked: the workload holds the memory on GPU 0 (559 MiB free of "
                                      "81559 MiB); the probe needs 1024 MiB")
    assert python.starts == 0
    live, check = run(tmp_path, python, scenario("gpu 0 memory 81559 81000"), profile="liveness")
    assert live.returncode == 0 and check["status"] == "pass" and python.starts == 0


def test_the_gpus_with_room_are_still_checked(tmp_path: Path, fake_nvml: Path,  # noqa: F811
                                              make_interp: Callable[..., Interp]) -> None:
    python, seen = interp(make_interp, tmp_path, count=2)
    done, check = run(tmp_path, python, scenario("gpu 1 memory 81559 81200", gpus=2))
    assert (done.returncode, check["status"], check["reason"]) == (0, "warn", "workload-memory"), check
    assert seen.read_text().split() == [UUIDS[0]]  # by UUID: torch's device 0 is the GPU with room
    assert check["output"].startswith("1 GPU(s) OK")
    assert "not checked: the workload holds the memory on GPU 1 (359 MiB free of 81559 MiB)" in check["output"]


def test_the_callers_own_selection_is_kept(tmp_path: Path, fake_nvml: Path,  # noqa: F811
                                           make_interp: Callable[..., Interp]) -> None:
    python, seen = interp(make_interp, tmp_path, count=2)
    lines = scenario("gpu 0 memory 81559 81200", gpus=2)
    _, check = run(tmp_path, python, lines, "startup", CUDA_VISIBLE_DEVICES="1")
    assert check["status"] == "pass" and seen.read_text().split() == ["1"]  # GPU 1 had room: left as it was
    _, check = run(tmp_path, python, scenario("gpu 1 memory 81559 81200", gpus=2), "startup",
                   CUDA_VISIBLE_DEVICES="1")
    assert check["reason"] == "workload-memory" and python.starts == 1  # its only GPU is full: not started


def test_when_nvml_cannot_say_the_gpu_is_checked_as_before(tmp_path: Path, fake_nvml: Path,  # noqa: F811
                                                           make_interp: Callable[..., Interp]) -> None:
    python, seen = interp(make_interp, tmp_path)
    _, check = run(tmp_path, python, scenario("gpu 0 unsupported memory"), "startup")
    assert check["status"] == "pass" and python.starts == 1 and seen.read_text().split() == ["unset"]
    _, check = run(tmp_path, python, scenario("gpu 0 memory 81559 81000"), "startup",
                   HEALTHCHECK_TORCH_MIN_FREE_MIB="0")
    assert check["status"] == "pass" and python.starts == 2


@pytest.mark.parametrize(("lines", "unknown"), [
    (["gpus 1", "gpu 0 unsupported memory"], "NVML gives no free memory for GPU 0"),
    (["init-error 9"], "NVML unavailable (driver-not-loaded)"),
    (["gpus 1", "gpu 0 mig 2"], "MIG mode (a MIG device's own memory is not read)"),
])
def test_what_nvml_cannot_say_is_noted_and_holds_nothing_back(
        fake_nvml: Path, scenario_file: Callable[..., Path], lines: list[str], unknown: str) -> None:  # noqa: F811
    scenario_file(*lines)
    space = deep.survey(1024, {})
    assert space.unknown == unknown and not space.full
    assert deep.room_facts(space.facts()) == space.facts()


def test_the_survey_narrows_to_the_gpus_with_room(fake_nvml: Path,  # noqa: F811
                                                 scenario_file: Callable[..., Path]) -> None:  # noqa: F811
    scenario_file(*scenario("gpu 0 memory 81559 81000", "gpu 1 memory 81559 79000", gpus=2))
    space = deep.survey(1024, {})
    assert [g.index for g in space.full] == [0] and [g.uuid for g in space.allowed] == [UUIDS[1]]
    assert space.unknown is None
    none_left = deep.survey(4096, {})
    assert len(none_left.full) == 2 and not none_left.allowed
    none_left = deep.survey(1024, {"CUDA_VISIBLE_DEVICES": "0"})
    assert [g.index for g in none_left.full] == [0] and not none_left.allowed
    assert not deep.survey(1024, {"CUDA_VISIBLE_DEVICES": UUIDS[1]}).full  # nothing held back
    assert deep.survey(0, {}).unknown == "off (HEALTHCHECK_TORCH_MIN_FREE_MIB=0)"


def test_a_gpu_reporting_no_memory_is_not_the_workloads_and_is_checked(tmp_path: Path, fake_nvml: Path,  # noqa: F811
                                                                       make_interp: Callable[..., Interp]) -> None:
    """0 MiB of 0 MiB is no workload holding the memory: NVML misreports the GPU (the nvml probe
    fails it); the worker runs there, and what it finds is the evidence."""
    python, seen = interp(make_interp, tmp_path)
    _, check = run(tmp_path, python, scenario("gpu 0 memory 0"), "startup")
    assert check["reason"] != deep.WORKLOAD_MEMORY.reason and "holds the memory" not in check.get("output", ""), check
    assert check["status"] == "pass" and python.starts == 1 and seen.read_text().split() == ["unset"]


def test_a_full_gpu_with_an_enormous_total_stays_in_the_result(tmp_path: Path, fake_nvml: Path,  # noqa: F811
                                                               make_interp: Callable[..., Interp]) -> None:
    """NVML's total is an unsigned 64-bit byte count: 2^40 MiB and more is a number it can give, and a
    GPU left out for want of room is named whatever its total."""
    python, seen = interp(make_interp, tmp_path, count=1)
    lines = scenario("gpu 1 memory 1099511627776 1099511627000", gpus=2)
    done, check = run(tmp_path, python, lines)
    assert (done.returncode, check["status"], check["reason"]) == (0, "warn", "workload-memory"), check
    assert "GPU 1 (776 MiB free of 1099511627776 MiB)" in check["output"]
    assert seen.read_text().split() == [UUIDS[0]]


@pytest.mark.parametrize(("lines", "unknown"), [
    (["gpus 1", "gpu 0 memory 0"], "NVML reports 0 MiB of memory for GPU 0 (misreported)"),
    (["gpus 2", "gpu 0 memory 0", "gpu 1 unsupported memory"],
     "NVML gives no free memory for GPU 1; NVML reports 0 MiB of memory for GPU 0 (misreported)"),
])
def test_a_gpu_reporting_no_memory_is_noted_and_holds_nothing_back(
        fake_nvml: Path, scenario_file: Callable[..., Path], lines: list[str], unknown: str) -> None:  # noqa: F811
    scenario_file(*lines)
    space = deep.survey(1024, {})
    assert space.unknown == unknown and not space.full
    assert deep.room_facts(space.facts()) == space.facts()
