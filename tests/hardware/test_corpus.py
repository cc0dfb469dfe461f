"""Real nvidia-smi outputs (tests/corpus/nvidia-smi) through the front door, printed by a stub nvidia-smi."""

from __future__ import annotations

import json

import pytest

from tests.conftest import clean_env, run_cli
from tests.corpus import Sample, load
from tests.fakes.nvidia_smi_stub import write_stub

SAMPLES = load("nvidia-smi")


def test_the_corpus_is_real_and_large_enough():
    assert len(SAMPLES) >= 25
    assert all(s.source.startswith("https://") and s.exit is not None and s.body for s in SAMPLES)
    assert {s.expect.split()[0] for s in SAMPLES} == {"pass", "fail"}


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_a_real_nvidia_smi_output_gets_its_verdict(sample: Sample, tmp_path):
    write_stub(tmp_path / "bin", "sample", text=sample.body, code=sample.exit or 0)
    env = clean_env(PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin", HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                    HEALTHCHECK_GPU_COUNT="1")
    res = run_cli("--only", "nvidia-smi", "--json", env=env, front_door=True, timeout=60)
    check = json.loads(res.stdout)["checks"]["nvidia-smi:gpus"][0]
    verdict, detail = sample.expect.split()
    if verdict == "pass":
        assert (res.returncode, check["status"], check["observedValue"]) == (0, "pass", int(detail)), res.stdout
    else:
        assert (res.returncode, check["status"], check["reason"]) == (1, "fail", detail), res.stdout
        assert "\n" not in check["output"] and len(check["output"]) < 400
