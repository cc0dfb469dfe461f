"""The nvml probe and the event watcher, through the real nvidia-ml-py bindings and the fake library."""

from __future__ import annotations

import threading
import time

import pytest

from probes.hardware import nvml, nvml_lib
from probes.result import Status
from tests.hardware.conftest import make_ctx


@pytest.fixture
def probe(fake_nvml, scenario, monkeypatch):
    """probe(*scenario_lines, gpu_count=2, env={...}) -> Result of the real gather + judge."""

    def run(*lines: str, gpu_count: int = 2, env: dict[str, str] | None = None):
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        scenario(*lines)
        c = make_ctx(gpu_count=gpu_count)
        return nvml.judge(nvml.gather(c), c)

    return run


def test_healthy_pair_passes_and_publishes_the_facts_contract(probe):
    r = probe("gpus 2", "gpu 1 process 4242 512 /opt/conda/bin/python", "gpu 1 compute-mode EXCLUSIVE_PROCESS")
    assert r.status is Status.PASS, r.message
    assert r.observed == 2 and r.unit == "gpus"
    assert "2 GPUs healthy" in r.message and "driver 550.54.15" in r.message
    f = r.facts
    assert f["count"] == 2
    assert [g["index"] for g in f["gpus"]] == [0, 1]
    assert f["gpus"][0]["compute_mode"] == "DEFAULT" and f["gpus"][0]["processes"] == []
    assert f["gpus"][1]["compute_mode"] == "EXCLUSIVE_PROCESS"
    assert f["gpus"][1]["processes"] == [{"pid": 4242, "name": "python"}]
    assert all(g["uuid"].startswith("GPU-") and g["name"] for g in f["gpus"])


def test_nvml_is_shut_down_after_gather(probe):
    probe("gpus 1", gpu_count=1)
    assert nvml_lib.bindings()._nvmlLib_refcount == 0


@pytest.mark.parametrize(("code", "reason", "words"), [
    (9, "driver-not-loaded", "modprobe nvidia"),
    (4, "no-permission", "--gpus all"),
    (12, "nvml-not-found", "HINT: libnvidia-ml.so.1 ships with the NVIDIA driver"),
    (999, "nvml-unknown-error", "systemctl daemon-reload"),
    (18, "driver-mismatch", "reboot the node"),
    (123, "nvml-error", "NVML error 123"),
])
def test_init_errors(probe, code, reason, words):
    r = probe(f"init-error {code}")
    assert r.status is Status.FAIL and r.reason == reason
    assert words in r.message and "\n" not in r.message


def test_void_visible_devices_explains_that_no_gpu_was_requested(probe):
    r = probe("init-error 12", env={"NVIDIA_VISIBLE_DEVICES": "void"})
    assert r.reason == "no-gpu-requested" and "NVIDIA_VISIBLE_DEVICES='void'" in r.message
    r = probe("init-error 12", gpu_count=0, env={"NVIDIA_VISIBLE_DEVICES": "none"})
    assert r.status is Status.PASS


def test_fewer_gpus_than_expected(probe):
    r = probe("gpus 1", gpu_count=2)
    assert r.reason == "gpu-count" and "NVML sees 1 GPU (expected at least 2)" in r.message


@pytest.mark.parametrize(("fault", "reason"), [("lost", "gpu-lost"), ("unknown-error", "gpu-unknown-error"),
                                               ("query-error 15", "gpu-lost")])
def test_lost_gpu_while_the_other_still_reports(probe, fault, reason):
    r = probe("gpus 2", f"gpu 1 {fault}")
    assert r.status is Status.FAIL and r.reason == reason
    assert "GPU 1" in r.message and "while 1 other GPU still reports" in r.message
    healthy, lost = r.facts["gpus"]
    assert healthy["uuid"].startswith("GPU-") and healthy["name"] and "error" not in healthy
    assert lost["error"] == reason and lost["compute_mode"] == "N/A"


@pytest.mark.parametrize(("lines", "status", "reason", "words"), [
    (["gpu 0 ecc uncorrected volatile 3"], Status.FAIL, "ecc-uncorrectable", "3 volatile uncorrectable ECC error(s)"),
    (["gpu 0 retired-pending"], Status.FAIL, "page-retirement-pending", "reset the GPU"),
    (["gpu 1 remap 0 0 1 0"], Status.FAIL, "row-remap-pending", "reset the GPU"),
    (["gpu 1 remap 0 1 0 1"], Status.FAIL, "row-remap-failure", "needs a reset"),
    (["gpu 0 clocks-event-reasons 0x40"], Status.WARN, "thermal-slowdown", "cooling"),
    (["gpu 0 clocks-event-reasons 0x20"], Status.WARN, "thermal-slowdown", "cooling"),
    (["gpu 0 clocks-event-reasons 0x8"], Status.WARN, "hw-slowdown", "power supply"),
    (["gpu 1 temperature 87 87"], Status.WARN, "temperature", "87 C"),
    (["gpu 0 mig 0"], Status.WARN, "mig-no-instances", "MIG mode"),
    (["gpu 1 memory 0"], Status.FAIL, "no-memory", "GPU 1 reports 0 MiB of memory"),
])
def test_per_gpu_faults(probe, lines, status, reason, words):
    r = probe("gpus 2", *lines)
    assert r.status is status and r.reason == reason, r.message
    assert words in r.message


def test_failures_come_before_warnings_and_the_rest_is_counted(probe):
    r = probe("gpus 2", "gpu 0 temperature 95 87", "gpu 1 ecc uncorrected volatile 1")
    assert r.reason == "ecc-uncorrectable" and r.message.endswith("(+1 more)")
    assert [p["reason"] for p in r.facts["problems"]] == ["ecc-uncorrectable", "temperature"]


@pytest.mark.parametrize("lines", [
    ["gpu 0 ecc uncorrected aggregate 5", "gpu 0 ecc corrected volatile 9"],  # history, not now
    ["gpu 0 clocks-event-reasons 0x1"],  # idle
    ["gpu 0 temperature 86 87"],
    ["gpu 0 memory 1099511627776 1099511627000"],  # 2^40 MiB: a number, not a fault of its own
])
def test_benign_readings_pass(probe, lines):
    assert probe("gpus 2", *lines).status is Status.PASS


def test_unsupported_fields_are_na_never_a_failure(probe):
    fields = ("ecc", "retired", "remap", "clocks", "temperature", "slowdown", "compute-mode", "processes",
              "mig", "memory")
    r = probe("gpus 2", *[f"gpu 0 unsupported {f}" for f in fields])
    assert r.status is Status.PASS, r.message
    assert r.facts["gpus"][0]["compute_mode"] == "N/A"


def test_mig_devices_are_counted_as_cuda_sees_them(probe):
    r = probe("gpus 2", "gpu 0 mig 3")
    assert r.status is Status.PASS
    assert r.facts["count"] == 4 and r.facts["physical_count"] == 2
    assert len(r.facts["gpus"][0]["mig_devices"]) == 3
    assert all(d["uuid"].startswith("MIG-") for d in r.facts["gpus"][0]["mig_devices"])
    assert "GPU 0: 3 MIG devices" in r.message


@pytest.mark.parametrize(("cvd", "status", "words"), [
    ("", Status.FAIL, "it is empty"),
    ("5", Status.FAIL, "selects no GPU"),
    ("1,1", Status.FAIL, "selects no GPU"),
    ("0", Status.FAIL, "leaves 1 GPU visible to CUDA (expected at least 2)"),
    ("0,1,2,3", Status.WARN, "CUDA stops at '2'"),  # a warning: a reason of its own
    ("1,0", Status.PASS, ""),
    ("GPU-0000abc1,GPU-0000abc0", Status.PASS, ""),
    ("GPU-0000abc1,GPU-ffff", Status.FAIL, "leaves 1 GPU"),
])
def test_cuda_visible_devices_against_nvml(probe, cvd, status, words):
    r = probe("gpus 2", env={"CUDA_VISIBLE_DEVICES": cvd})
    assert r.status is status, r.message
    if words:
        reason = "cuda-visible-devices" if status is Status.FAIL else "cuda-visible-devices-partial"
        assert r.reason == reason and words in r.message


def test_nvidia_visible_devices_listing_more_than_nvml_sees(probe):
    r = probe("gpus 2", env={"NVIDIA_VISIBLE_DEVICES": "0,1,2,3"})
    assert r.status is Status.WARN and r.reason == "nvidia-visible-devices"
    assert probe("gpus 2", env={"NVIDIA_VISIBLE_DEVICES": "all"}).status is Status.PASS


def test_cuda_visible_parsing_follows_cuda():
    devs = ["GPU-aaa", "GPU-abb", "MIG-ccc"]
    assert nvml.cuda_visible("0,2", devs) == (["GPU-aaa", "MIG-ccc"], None)
    assert nvml.cuda_visible("1gpu,0", devs) == (["GPU-abb", "GPU-aaa"], None)  # strtoul-like
    assert nvml.cuda_visible("0,-1,1", devs) == (["GPU-aaa"], "-1")
    assert nvml.cuda_visible("GPU-a", devs) == ([], "GPU-a")  # ambiguous prefix
    assert nvml.cuda_visible("MIG-c", devs) == (["MIG-ccc"], None)
    assert nvml.cuda_visible("0,0", devs) == ([], "0")


def test_on_deadline_names_the_wedged_driver(ctx):
    r = nvml.on_deadline(ctx)
    assert r.status is Status.FAIL and r.reason == "deadline"
    assert "dmesg" in r.message and "reboot the node" in r.message


# ---- events -------------------------------------------------------------------------------------

def collect(stop: threading.Event, want: int, wait_ms: int = 50, limit: float = 5.0) -> list:
    got = []
    t0 = time.monotonic()
    for ev in nvml_lib.watch_events(stop, wait_ms=wait_ms):
        got.append(ev)
        if len(got) >= want or time.monotonic() - t0 > limit:
            stop.set()
    return got


def test_watch_events_yields_xid_and_ecc_from_every_gpu(fake_nvml, scenario):
    scenario("gpus 3", "gpu 2 lost", "event 1 xid 79 150", "event 0 ecc-single 1 50",
             "event 0 ecc-double 2 100", "event 2 xid 48 10")
    got = collect(threading.Event(), want=3)
    assert [(e.gpu_index, e.kind, e.data) for e in got] == [(0, "ecc-single", 1), (0, "ecc-double", 2),
                                                            (1, "xid", 79)]
    assert got[2].uuid == "GPU-0000abc1-fake-4000-8000-000000000001"
    assert nvml_lib.bindings()._nvmlLib_refcount == 0  # event set freed, NVML shut down


def test_watch_events_honours_stop_while_idle(fake_nvml, scenario):
    scenario("gpus 1")
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    assert list(nvml_lib.watch_events(stop, wait_ms=100)) == []
    assert time.monotonic() - t0 < 0.3 + 0.5


def test_watch_events_raises_a_clear_error_when_nvml_cannot_start(fake_nvml, scenario):
    scenario("init-error 9")
    with pytest.raises(nvml_lib.NvmlUnavailable) as info:
        nvml_lib.watch_events(threading.Event())
    assert info.value.reason == "driver-not-loaded" and "modprobe nvidia" in info.value.message


def test_watch_events_skips_gpus_without_event_support(fake_nvml, scenario):
    scenario("gpus 2", "gpu 0 unsupported events", "event 0 xid 13 10", "event 1 xid 31 50")
    got = collect(threading.Event(), want=1)
    assert [(e.gpu_index, e.data) for e in got] == [(1, 31)]


def test_slowdown_sampling_reads_a_driver_before_the_clock_event_rename(fake_nvml, scenario):
    """serve's sampling asks the same query as the probe: by its old name where the new one is missing."""
    scenario("gpus 2", "missing nvmlDeviceGetCurrentClocksEventReasons", "gpu 1 clocks-event-reasons 0x88")
    stop = threading.Event()
    timer = threading.Timer(3.0, stop.set)  # no event at all: the test ends, and fails
    timer.start()
    got = []
    for ev in nvml_lib.watch_events(stop, wait_ms=50, sample_s=0.05):
        got.append(ev)
        stop.set()
    timer.cancel()
    assert [(e.gpu_index, e.kind, e.data) for e in got] == [(1, "slowdown", 0x88)]
