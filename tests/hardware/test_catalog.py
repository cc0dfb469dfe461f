"""The hardware layer's causes are a catalog: each declared once with who acts and how, every
warning and failure built from one, and the nvml facts read once, typed, by the probes above."""

from __future__ import annotations

from probes import proc, registry
from probes.hardware import common as hw
from probes.hardware import nvidia_smi, nvml, runtime
from probes.result import Result, Status
from tests.fakes.nvidia_smi_stub import MESSAGES
from tests.hardware.conftest import make_ctx

SPECS = tuple(s for s in registry.PROBES if s.layer == "hardware")


def test_a_cause_both_probes_report_is_one_declaration():
    smi = {c.reason: c for c in nvidia_smi.SPEC.causes}
    both = [c for c in nvml.SPEC.causes if c.reason in smi]
    assert {c.reason for c in both} >= {"gpu-lost", "driver-not-loaded", "nvml-not-found", "inforom-corrupted",
                                         "nvml-unknown-error", "no-permission", "driver-mismatch",
                                         "reset-required", "nvml-too-old", "gpu-count", "deadline"}
    assert all(smi[c.reason] is c for c in both)
    assert hw.DRIVER_MISMATCH.actor == "operator" and hw.GPU_LOST.action == "reset-gpu"


def test_the_settings_are_declared_once():
    assert runtime.SPEC.settings[0] is nvml.SPEC.settings[0] is nvidia_smi.SPEC.settings[0]
    assert [s.field for s in runtime.Settings.SETTINGS] == ["gpu_count", "shm_path", "shm_min_mib", "dev_root"]
    assert make_ctx(gpu_count=3).config.of(runtime.Settings).gpu_count == 3


def _smi(code: int | None = 0, out: str = "", **kw) -> Result:
    return nvidia_smi.judge(proc.Completed(nvidia_smi.ARGV, code, out.encode(), b"", **kw), make_ctx())


def _results() -> list[Result]:
    """A warning or failure of each kind the hardware judges give."""
    smi = [_smi(code, MESSAGES.get(code, "")) for code in nvidia_smi.EXIT_CODES]
    smi += [_smi(None, spawn_error="not found"), _smi(-9), _smi(254), _smi(0, "garbage\n"), _smi(0, ""),
            _smi(None, timed_out=True, elapsed=1.0), _smi(None, stuck=True, held_by=7)]
    gathered = nvml.Gathered({"CUDA_VISIBLE_DEVICES": "0,7", "NVIDIA_VISIBLE_DEVICES": None}, count=2, gpus=(
        nvml.Gpu(0, uuid="GPU-a", ecc_uncorrected_volatile=2, temperature=90, slowdown_temperature=85),
        nvml.Gpu(1, error=15)))
    ours = [nvml.judge(gathered, make_ctx(gpu_count=1)), nvml.on_deadline(make_ctx())]
    rt = runtime.Gathered(1 << 20, None, frozenset(), frozenset(), {"CUDA_LAUNCH_BLOCKING": "1"}, None)
    return [*smi, *ours, runtime.judge(rt, make_ctx(gpu_count=0))]


def test_every_warning_and_failure_is_its_cause_with_the_detail_seen_and_the_remedy_declared():
    causes = {(c.reason, c.status): c for spec in SPECS for c in spec.causes}
    results = _results()
    assert {r.reason for r in results} >= {"gpu-lost", "driver-mismatch", "exit-code", "not-found", "killed",
                                           "unparseable", "gpu-count", "deadline", "stuck", "ecc-uncorrectable",
                                           "shm-small"}
    for r in results:
        assert r.status in (Status.WARN, Status.FAIL), r
        c = causes[r.reason, r.status.value]
        assert (r.action, r.actor) == (c.action, c.actor)
        remedy = c.remedy.replace("`", "")
        assert remedy in r.message and not r.message.startswith(remedy), r.message


def test_the_first_failure_comes_first_and_the_rest_are_counted():
    problems = [hw.Problem(nvml.HOT, "hot"), hw.Problem(hw.GPU_LOST, "lost"), hw.Problem(nvml.ECC, "ecc")]
    facts: dict = {}
    r = hw.worst("nvml", problems, facts)
    assert r is not None and r.reason == "gpu-lost" and r.message.startswith("lost: reset the GPU")
    assert r.message.endswith(" (+2 more)") and r.facts is facts
    assert [p["reason"] for p in facts["problems"]] == ["gpu-lost", "ecc-uncorrectable", "temperature"]
    assert hw.worst("nvml", [], facts) is None and facts["problems"] == []


# ---- the nvml facts, as the probes above read them ------------------------------------------------

def _nvml(facts: dict, status: Status = Status.PASS) -> dict[str, Result]:
    return {"nvml": Result("nvml", status, "x", facts=facts)}


def test_what_the_real_nvml_probe_publishes_reads_back(fake_nvml, scenario):
    scenario("gpus 2", "gpu 1 process 4242 512 /opt/conda/bin/python", "gpu 1 compute-mode EXCLUSIVE_PROCESS",
             "cuda-driver 12040")
    ctx = make_ctx()
    result = nvml.judge(nvml.gather(ctx), ctx)
    seen = hw.seen({"nvml": result})
    assert seen is not None and seen.ok and seen.count == 2 and seen.cuda_driver == "12.4"
    assert [(g.index, g.compute_mode) for g in seen.gpus] == [(0, "DEFAULT"), (1, "EXCLUSIVE_PROCESS")]
    assert seen.gpus[1].processes == ((4242, "python", False),) and seen.gpus[1].uuid.startswith("GPU-")


def test_facts_without_their_type_are_left_out_once():
    gpus = [{"index": True, "uuid": 5, "compute_mode": None, "persistence": "no",
             "processes": [{"pid": "7"}, {"pid": True}, {"pid": 0}, {"pid": 2**22}, {"pid": 9, "mps": True}, 3]},
            "not a gpu", {"index": 1, "persistence": False, "processes": "x"}]
    seen = hw.seen(_nvml({"count": -1, "cuda_driver": 12040, "gpus": gpus}, Status.FAIL))
    assert seen == hw.Seen(False, None, None, (hw.SeenGpu(None, "", hw.NA, None, ((9, "?", True),)),
                                               hw.SeenGpu(1, "", hw.NA, False, ())))
    assert hw.seen(_nvml({"count": True, "gpus": {}})) == hw.Seen(True, None, None, ())
    assert hw.seen({}) is None
