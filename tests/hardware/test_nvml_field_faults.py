"""What fleets see: could-not-check is a warning, a failing supported field fails, and the
driver's recovery action, fabric state and interconnects, through the real bindings over the fake."""

from __future__ import annotations

import subprocess
import sys

import pytest

from probes.hardware import nvml
from probes.result import Status
from tests.conftest import ROOT
from tests.hardware.conftest import cli_env, make_ctx


@pytest.fixture
def probe(fake_nvml, scenario):
    def run(*lines: str, gpu_count: int = 1):
        scenario(*lines)
        c = make_ctx(gpu_count=gpu_count)
        return nvml.judge(nvml.gather(c), c)

    return run


MIG_SLICE = ("gpus 1", "gpu 0 mig 1", "gpu 0 field-error ecc 4", "gpu 0 field-error retired 4",
             "gpu 0 field-error remap 4", "gpu 0 field-error temperature 4", "gpu 0 field-error clocks 4")


def test_mig_slice_without_permission_on_the_parent_warns(probe):
    r = probe(*MIG_SLICE)
    assert r.status is Status.WARN and r.reason == "mig-no-permission", r.message
    assert "NO_PERMISSION" in r.message and "not a fault" in r.message and "ecc" in r.message


def test_permission_denied_outside_mig_warns_with_its_own_reason(probe):
    r = probe("gpus 1", "gpu 0 field-error temperature 4")
    assert r.status is Status.WARN and r.reason == "field-no-permission", r.message


@pytest.mark.parametrize(("field", "code"), [("ecc", 16), ("retired", 10), ("remap", 2), ("recovery", 10),
                                             ("compute-mode", 14), ("persistence", 10), ("pcie", 2)])
def test_unsupported_is_not_judged_but_a_supported_field_that_errors_fails_closed(probe, field, code):
    r = probe("gpus 1", f"gpu 0 unsupported {field}")
    assert r.status is Status.PASS, r.message
    r = probe("gpus 1", f"gpu 0 field-error {field} {code}")
    assert r.status is Status.FAIL and r.reason == "field-error", r.message
    assert f"code {code}" in r.message and "GPU 0" in r.message


@pytest.mark.parametrize(("action", "words"), [(1, "GPU reset"), (2, "reboot the node"), (3, "drain P2P"),
                                               (4, "drain the workload, then reset")])
def test_pending_recovery_action_fails_with_the_action_as_remedy(probe, action, words):
    assert probe("gpus 2", "gpu 1 recovery-action 0", gpu_count=2).status is Status.PASS
    r = probe("gpus 2", f"gpu 1 recovery-action {action}", gpu_count=2)
    assert r.status is Status.FAIL and r.reason == "recovery-action", r.message
    assert "GPU 1" in r.message and words in r.message


@pytest.mark.parametrize("lines", [["gpu 0 fabric 1"], ["gpu 0 fabric 2"], ["gpu 0 fabric 3 999"]])
def test_fabric_not_completed_fails_and_completed_or_unsupported_passes(probe, lines):
    assert probe("gpus 1", "gpu 0 fabric 3").status is Status.PASS
    assert probe("gpus 1", "gpu 0 fabric 0").status is Status.PASS  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    r = probe("gpus 1", *lines)
    assert r.status is Status.FAIL and r.reason == "fabric-manager", r.message
    assert "error 802" in r.message and "nvidia-fabricmanager" in r.message


def test_driver_cuda_version_and_persistence_are_published(probe):
    r = probe("gpus 1", "cuda-driver 12020", "gpu 0 persistence 0")
    assert r.facts["cuda_driver"] == "12.2"
    assert r.facts["gpus"][0]["persistence"] is False


def test_mps_clients_are_published_as_holders(probe):
    r = probe("gpus 1", "gpu 0 compute-mode EXCLUSIVE_PROCESS", "gpu 0 mps-process 77 100 nvidia-cuda-mps-server")
    assert r.status is Status.PASS
    assert r.facts["gpus"][0]["processes"] == [{"pid": 77, "name": "nvidia-cuda-mps-server", "mps": True}]


def test_pcie_below_max_warns_only_while_busy(probe):
    assert probe("gpus 1", "gpu 0 pcie 1 16 5 16", "gpu 0 utilization 3").status is Status.PASS
    r = probe("gpus 1", "gpu 0 pcie 3 8 5 16", "gpu 0 utilization 95")
    assert r.status is Status.WARN and r.reason == "pcie-degraded", r.message
    assert "gen 3 x8" in r.message and "max gen 5 x16" in r.message


def test_nvlink_down_and_rising_errors_warn(probe):
    r = probe("gpus 1", "gpu 0 nvlink 18 0x4")
    assert r.status is Status.WARN and r.reason == "nvlink-down" and "link(s) 2 down of 18" in r.message
    r = probe("gpus 1", "gpu 0 nvlink 4", "gpu 0 nvlink-errors 3")
    assert r.status is Status.WARN and r.reason == "nvlink-errors", r.message
    # PCIe-only GPUs are never warned about NVLink
    assert probe("gpus 1", "gpu 0 nvlink-errors 3").status is Status.PASS


def test_mig_slice_through_the_cli_is_a_warning_and_exit_0(tmp_path, fake_nvml):
    from tests.fakes.nvidia_smi_stub import write_stub

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_stub(bin_dir, "ok", gpus=1)
    path = tmp_path / "scenario.txt"
    path.write_text("".join(line + "\n" for line in MIG_SLICE))
    env = cli_env(tmp_path, stub_dir=bin_dir, scenario_file=path, HEALTHCHECK_GPU_COUNT="1",
                  ENABLE_TORCH_CHECK="false", ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false")
    for profile in ("liveness", "readiness"):
        done = subprocess.run([sys.executable, "-m", "probes", "--profile", profile], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "WARN nvml" in done.stdout and "NO_PERMISSION" in done.stdout


def test_what_older_drivers_and_races_answer_is_not_a_fault(probe):
    # a driver that predates the recovery-action field answers INVALID_ARGUMENT for its id
    assert probe("gpus 1", "gpu 0 field-error recovery 2").status is Status.PASS
    # the process list grew between the bindings' two calls
    assert probe("gpus 1", "gpu 0 field-error processes 7").status is Status.PASS
    # while a real failure of the same field still fails
    assert probe("gpus 1", "gpu 0 field-error recovery 10").reason == "field-error"


def test_fields_not_judged_are_listed_in_the_facts_without_a_warning(probe):
    r = probe("gpus 1", "gpu 0 unsupported ecc", "gpu 0 unsupported retired")
    assert r.status is Status.PASS, r.message
    not_judged = r.facts["gpus"][0]["not_judged"]
    assert not_judged["ecc"] == not_judged["retired pages"] == "not supported"
    assert not_judged["fabric state"] == "not supported"  # no NVSwitch fabric on this GPU
    assert "temperature" not in not_judged


@pytest.mark.parametrize("missing", ["nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"])
def test_fabric_is_read_through_whichever_call_the_driver_has(probe, missing):
    r = probe("gpus 1", f"missing {missing}", "gpu 0 fabric 1")
    assert r.status is Status.FAIL and r.reason == "fabric-manager", r.message
    assert probe("gpus 1", f"missing {missing}", "gpu 0 fabric 3").status is Status.PASS


def test_a_driver_without_either_fabric_call_is_not_judged(probe):
    r = probe("gpus 1", "missing nvmlDeviceGetGpuFabricInfo", "missing nvmlDeviceGetGpuFabricInfoV",
              "gpu 0 fabric 1")
    assert r.status is Status.PASS and r.facts["gpus"][0]["not_judged"]["fabric state"] == "not supported"


def test_a_driver_before_the_clock_event_rename_is_read_by_its_throttle_name(probe):
    r = probe("gpus 1", "missing nvmlDeviceGetCurrentClocksEventReasons", "gpu 0 clocks-event-reasons 0x8")
    assert r.status is Status.WARN and r.reason == "hw-slowdown", r.message
    assert "clock event reasons" not in r.facts["gpus"][0].get("not_judged", {})  # it was read
