"""Worker faults with real child processes: wrapper interpreters and a fake torch package.

Each run must give its own diagnosis, end by its deadline (+0.5 s) and leave no
process behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from probes import untrusted
from probes.framework import torch_worker
from probes.result import Result, Status
from probes.state import State
from tests.framework.conftest import REAL_PYTHON, Interp, probe

pytestmark = pytest.mark.loaded  # under load too: make loaded (Makefile)

SLACK = 0.5


def run_checked(interp: object, tmp_path: Path, alive: Callable[[], list[int]], *, timeout: float = 20.0,
                **kw: object) -> Result:
    result, elapsed, _ = probe(interp, tmp_path, timeout=timeout, **kw)  # type: ignore[arg-type]
    assert elapsed <= timeout + SLACK, f"took {elapsed:.2f}s for a {timeout}s deadline"
    assert alive() == [], "a worker process outlived its run"
    assert "Traceback" not in result.message and "\n" not in result.message
    return result


def shown(interp: object) -> str:
    """The interpreter as a message names it: cleaned, and cut where its path is long (as under xdist)."""
    return untrusted.clean(str(interp), 80)


def test_interpreter_not_found(tmp_path: Path, marker: Callable[[], list[int]]) -> None:
    result = run_checked(tmp_path / "no-such-python", tmp_path, marker)
    assert result.status is Status.FAIL and result.reason == "interpreter-not-found"
    assert "HEALTHCHECK_TORCH_PYTHON" in result.message and shown(tmp_path / "no-such-python") in result.message


def test_wrapper_whose_interpreter_is_missing(make_interp: Callable[..., Interp], tmp_path: Path,
                                              marker: Callable[[], list[int]]) -> None:
    py = make_interp("gone", body='exec /nonexistent/python3 "$@"')
    result = run_checked(py, tmp_path, marker)
    assert result.reason == "interpreter-not-found"


def test_a_loader_out_of_address_space_is_the_memory_limit_not_a_missing_interpreter(
        make_interp: Callable[..., Interp], tmp_path: Path, marker: Callable[[], list[int]]) -> None:
    """Under a small RLIMIT_AS the dynamic loader of the image's python can fail to map a library:
    it says so and exits 127, the status of a missing interpreter too."""
    py = make_interp("mapfail", body="echo 'python3: error while loading shared libraries: libpython3.so: "
                                     "failed to map segment from shared object' >&2; exit 127")
    result = run_checked(py, tmp_path, marker)
    assert result.status is Status.FAIL and result.reason == "memory-limit", result


def test_interpreter_without_torch(make_interp: Callable[..., Interp], tmp_path: Path,
                                   marker: Callable[[], list[int]]) -> None:
    py = make_interp("bare", python_args="-I -S")  # no site-packages: no torch
    result = run_checked(py, tmp_path, marker)
    assert result.status is Status.FAIL and result.reason == "torch-missing"
    assert shown(py) in result.message and "HEALTHCHECK_TORCH_PYTHON" in result.message


def test_torch_import_fails_on_a_dependency(make_interp: Callable[..., Interp], tmp_path: Path,
                                            marker: Callable[[], list[int]]) -> None:
    result = run_checked(make_interp("dep", mode="missing-dep"), tmp_path, marker)
    assert result.reason == "torch-import-failed" and "'numpy' is missing" in result.message


def test_hang_in_import_ends_by_the_deadline(make_interp: Callable[..., Interp], tmp_path: Path,
                                             marker: Callable[[], list[int]]) -> None:
    result = run_checked(make_interp("hang", mode="hang-import"), tmp_path, marker, timeout=3.0)
    assert result.status is Status.FAIL and result.reason == "deadline"
    assert "import" in result.message


def test_worker_that_ignores_sigterm_is_killed(make_interp: Callable[..., Interp], tmp_path: Path,
                                               marker: Callable[[], list[int]]) -> None:
    result = run_checked(make_interp("stubborn", mode="ignore-term"), tmp_path, marker, timeout=3.0)
    assert result.status is Status.FAIL and result.reason == "deadline"


def test_garbage_output(make_interp: Callable[..., Interp], tmp_path: Path,
                        marker: Callable[[], list[int]]) -> None:
    py = make_interp("garbage", body="printf 'hello \\033[31mworld\\n'; exit 0")
    result = run_checked(py, tmp_path, marker)
    assert result.status is Status.FAIL and result.reason == "bad-output"
    assert "no result line" in result.message and "'hello \\x1b[31mworld'" in result.message


def test_forged_line_with_extra_fields_is_garbage(make_interp: Callable[..., Interp], tmp_path: Path,
                                                  marker: Callable[[], list[int]]) -> None:
    py = make_interp("forged", body=f"echo '{torch_worker.PREFIX}{{\"status\": \"pass\"}}'")
    result = run_checked(py, tmp_path, marker)
    assert result.reason == "bad-output" and "unexpected or missing fields" in result.message


def test_stray_prints_cannot_forge_the_result(make_interp: Callable[..., Interp], tmp_path: Path,
                                              marker: Callable[[], list[int]]) -> None:
    # The fake torch prints a prefixed line while imported: the worker sends it to stderr.
    result = run_checked(make_interp("noisy", mode="print-noise"), tmp_path, marker)
    assert result.status is Status.PASS, result.message


def test_wrong_numbers_fail(make_interp: Callable[..., Interp], tmp_path: Path,
                            marker: Callable[[], list[int]]) -> None:
    result = run_checked(make_interp("wrong", mode="wrong"), tmp_path, marker)
    assert result.status is Status.FAIL and result.reason == "wrong-result"
    assert "cuda:0" in result.message and "silent data corruption" in result.message


def test_real_torch_with_an_edited_result_line_fails(make_interp: Callable[..., Interp], tmp_path: Path,
                                                     marker: Callable[[], list[int]]) -> None:
    # The real worker and real torch; the wrapper multiplies the reported error by 10^6.
    edit = ("import json,subprocess,sys; p='" + torch_worker.PREFIX + "'; "
            f"out=subprocess.run(['{REAL_PYTHON}']+sys.argv[1:],stdout=subprocess.PIPE).stdout.decode(); "
            "r=json.loads(out[len(p):]); r['devices'][0]['max_err']*=1e6; print(p+json.dumps(r))")
    py = make_interp("edited", body=f'exec "{REAL_PYTHON}" -c "{edit}" "$@"')
    result = run_checked(py, tmp_path, marker, device="cpu", timeout=60.0)
    assert result.status is Status.FAIL and result.reason == "wrong-result", result.message


def test_killed_by_a_signal(make_interp: Callable[..., Interp], tmp_path: Path,
                            marker: Callable[[], list[int]]) -> None:
    result = run_checked(make_interp("segv", mode="segv"), tmp_path, marker)
    assert result.status is Status.FAIL and result.reason == "killed" and "SIGSEGV" in result.message


def test_worker_gets_lazy_module_loading(make_interp: Callable[..., Interp], tmp_path: Path,
                                         marker: Callable[[], list[int]]) -> None:
    seen = tmp_path / "env"
    py = make_interp("envcheck", mode="ok",
                     body=f'echo "$CUDA_MODULE_LOADING" > "{seen}"; exec "{REAL_PYTHON}" "$@"')
    run_checked(py, tmp_path, marker)
    assert seen.read_text().strip() == "LAZY"


@pytest.mark.parametrize(("mode", "reason", "status", "words"), [
    ("ok", None, Status.PASS, "1 GPU(s) OK"),
    ("cpu-build", "cpu-only-build", Status.FAIL, "CUDA not available"),
    ("unavailable", "cuda-unavailable", Status.FAIL, "--gpus all"),
    ("old-driver", "driver-too-old", Status.FAIL, "built for CUDA 12.1, driver supports CUDA 11.4"),
    ("oom", "oom", Status.WARN, "out of memory for the probe's own context"),
    ("busy", "device-busy", Status.WARN, "cuda:0 busy"),
    ("fatal", "cuda-fatal", Status.FAIL, "illegal memory access"),
    ("fatal-init", "cuda-unknown", Status.FAIL, "unknown error"),
])
def test_cuda_diagnoses(mode: str, reason: str | None, status: Status, words: str,
                        make_interp: Callable[..., Interp], tmp_path: Path,
                        marker: Callable[[], list[int]]) -> None:
    result = run_checked(make_interp(mode, mode=mode), tmp_path, marker, state=State.off("test"))
    assert (result.status, result.reason) == (status, reason), result.message
    assert words in result.message


def test_multi_gpu_reports_every_device(make_interp: Callable[..., Interp], tmp_path: Path,
                                        marker: Callable[[], list[int]]) -> None:
    py = make_interp("four", mode="ok", exports={"FAKE_TORCH_COUNT": "4"})
    result = run_checked(py, tmp_path, marker)
    assert result.status is Status.PASS and result.observed == 4
    assert result.message.startswith("4 GPU(s) OK") and "70.0/80.0 GiB" in result.message
    assert [d["index"] for d in result.facts["devices"]] == [0, 1, 2, 3]


def test_count_mismatch_with_nvml(make_interp: Callable[..., Interp], tmp_path: Path,
                                  marker: Callable[[], list[int]]) -> None:
    nvml = Result("nvml", Status.PASS, "ok", facts={"count": 2, "gpus": []})
    result = run_checked(make_interp("one", mode="ok"), tmp_path, marker, results={"nvml": nvml})
    assert result.reason == "count-mismatch" and "torch sees 1 GPU(s) but NVML sees 2" in result.message


def test_busy_device_names_its_holder(make_interp: Callable[..., Interp], tmp_path: Path,
                                      marker: Callable[[], list[int]]) -> None:
    gpus = [{"index": i, "name": "H100", "uuid": f"GPU-58b5a2e2-0000-0000-0000-00000000000{i}",
             "compute_mode": "EXCLUSIVE_PROCESS",
             "processes": [{"pid": 4242, "name": "python train.py"}] if i == 1 else []} for i in range(2)]
    nvml = Result("nvml", Status.PASS, "ok", facts={"count": 2, "gpus": gpus})
    py = make_interp("busy1", mode="busy-one", exports={"FAKE_TORCH_COUNT": "2"})
    result = run_checked(py, tmp_path, marker, results={"nvml": nvml})
    assert result.status is Status.WARN and result.reason == "device-busy"
    assert "cuda:1 busy (EXCLUSIVE_PROCESS compute mode; held by pid 4242 (python train.py))" in result.message
    assert "1 other device(s) OK" in result.message
