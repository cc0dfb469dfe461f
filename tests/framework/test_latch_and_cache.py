"""The sticky CUDA-fatal latch, the TTL cache and one shared worker for concurrent runs.

Worker starts are counted by wrapper interpreters that append a line per start.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from probes.framework import torch_cuda
from probes.result import Result, Status
from probes.state import LATCH, State
from tests.conftest import PYTHON, ROOT, clean_env
from tests.framework.conftest import Interp, probe

pytestmark = pytest.mark.loaded  # under load too: make loaded (Makefile)


def test_fatal_error_latches_and_latched_runs_start_no_worker(make_interp: Callable[..., Interp],
                                                              tmp_path: Path) -> None:
    py = make_interp("fatal", mode="fatal")
    first, _, _ = probe(py, tmp_path)
    assert first.reason == "cuda-fatal" and py.starts == 1
    latch = json.loads((tmp_path / "state" / LATCH).read_text())
    assert latch["source"] == "torch-cuda" and "illegal memory access" in latch["reason"]
    for profile in ("readiness", "startup", "liveness"):
        result, elapsed, _ = probe(py, tmp_path, profile=profile)
        assert result.status is Status.FAIL and result.reason == "latched", result.message
        assert "latched unhealthy since" in result.message and "illegal memory access" in result.message
        assert elapsed < 2.0  # a generous bound; the benchmark measures the real figure
    assert py.starts == 1, "a latched run started a worker"


def test_the_latch_keeps_the_reason_code_for_serve_and_its_metrics(make_interp: Callable[..., Interp],
                                                                    tmp_path: Path) -> None:
    probe(make_interp("fatal", mode="fatal"), tmp_path)
    latch = State.open(str(tmp_path / "state")).latch()
    assert latch is not None and latch["code"] == "cuda-fatal", latch


def test_a_new_container_life_clears_the_latch(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    py = make_interp("fatal", mode="fatal")
    probe(py, tmp_path)
    path = tmp_path / "state" / LATCH
    latch = json.loads(path.read_text())
    latch["identity"] += "1"  # another PID namespace and /proc mount: the container restarted
    path.write_text(json.dumps(latch))
    ok = make_interp("ok", mode="ok")
    result, _, _ = probe(ok, tmp_path)
    assert result.status is Status.PASS and ok.starts == 1
    assert not path.exists()


def test_liveness_only_reads_the_latch(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    py = make_interp("never", mode="ok")
    result, _, _ = probe(py, tmp_path, profile="liveness")
    assert result.status is Status.PASS and "no CUDA-fatal latch" in result.message
    result, _, _ = probe(py, tmp_path, profile="liveness", state=State.off("read-only file system"))
    assert result.status is Status.PASS and "state dir off" in result.message
    assert py.starts == 0


def test_busy_and_oom_never_latch(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    for mode in ("busy", "oom"):
        result, _, _ = probe(make_interp(mode, mode=mode), tmp_path, profile="startup")
        assert result.status is Status.WARN
    assert not (tmp_path / "state" / LATCH).exists()


def test_readiness_reuses_a_fresh_pass(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    py = make_interp("ok", mode="ok")
    first, _, _ = probe(py, tmp_path)
    second, _, _ = probe(py, tmp_path)
    assert first.status is second.status is Status.PASS
    assert py.starts == 1
    assert "(cached, " in second.message and "s old)" in second.message
    # startup always runs fresh; a TTL of 0 turns reuse off.
    probe(py, tmp_path, profile="startup")
    assert py.starts == 2
    probe(py, tmp_path, ttl=0)
    assert py.starts == 3


def test_a_failing_result_is_not_reused_by_ttl(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    py = make_interp("wrong", mode="wrong")
    probe(py, tmp_path)
    result, _, _ = probe(py, tmp_path)
    assert result.reason == "wrong-result" and py.starts == 2


def test_a_changed_setting_is_not_served_from_the_cache(make_interp: Callable[..., Interp],
                                                        tmp_path: Path) -> None:
    py = make_interp("ok", mode="ok")
    probe(py, tmp_path)
    nvml = Result("nvml", Status.PASS, "ok", facts={"count": 1, "gpus": []})
    probe(py, tmp_path, results={"nvml": nvml})
    assert py.starts == 2


def test_without_a_state_dir_every_run_starts_a_worker(make_interp: Callable[..., Interp],
                                                       tmp_path: Path) -> None:
    py = make_interp("ok", mode="ok")
    off = State.off("/run/healthcheck is not writable")
    for _ in range(2):
        result, _, _ = probe(py, tmp_path, state=off)
        assert result.status is Status.PASS
    assert py.starts == 2


def test_concurrent_waiters_share_a_failing_result(make_interp: Callable[..., Interp],
                                                   tmp_path: Path) -> None:
    # The worker takes a second, so every thread starts before it finishes; each waiter
    # must take that result, failing or not, instead of starting a second CUDA context.
    py = make_interp("slow-wrong", mode="wrong", exports={"FAKE_TORCH_SLEEP": "1.0"})
    results: list[Result] = []

    def one() -> None:
        results.append(probe(py, tmp_path, profile="startup")[0])

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert py.starts == 1
    assert len(results) == 8 and all(r.reason == "wrong-result" for r in results)
    assert sum("shared with a concurrent run" in r.message for r in results) == 7


def test_a_waiter_gives_up_by_its_own_deadline(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    py = make_interp("slow", mode="ok", exports={"FAKE_TORCH_SLEEP": "4.0"})
    holder = threading.Thread(target=probe, args=(py, tmp_path), kwargs={"timeout": 30.0})
    holder.start()
    time.sleep(0.5)
    result, elapsed, _ = probe(py, tmp_path, timeout=1.5)
    holder.join(30)
    assert result.status is Status.FAIL and result.reason == "deadline" and "holds the lock" in result.message
    assert elapsed <= 1.5 + 0.5 and py.starts == 1


def test_twenty_concurrent_cli_runs_start_one_worker(make_interp: Callable[..., Interp],
                                                     tmp_path: Path) -> None:
    py = make_interp("real")  # the real interpreter and the real (CPU) torch
    env = clean_env(HEALTHCHECK_TORCH_PYTHON=str(py), HEALTHCHECK_TORCH_DEVICE="cpu",
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_TIMEOUT="120",
                    HEALTHCHECK_PROFILE="readiness")
    procs = [subprocess.Popen([PYTHON, "-m", "probes", "--only", torch_cuda.SPEC.name], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(20)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0] * 20, outs
    assert py.starts == 1, f"{py.starts} workers started"
    assert sum("cached" in o or "shared" in o for o, _ in outs) == 19


def test_a_damaged_cache_file_is_a_miss(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    py = make_interp("ok", mode="ok")
    probe(py, tmp_path)
    path = tmp_path / "state" / torch_cuda.CACHE
    entry = json.loads(path.read_text())
    entry["data"]["report"]["devices"] = "broken"
    path.write_text(json.dumps(entry))
    result, _, _ = probe(py, tmp_path)
    assert result.status is Status.PASS and "cached" not in result.message and py.starts == 2


def test_a_fatal_error_without_a_state_dir_says_it_cannot_latch(make_interp: Callable[..., Interp],
                                                                tmp_path: Path) -> None:
    """Nothing may promise "unhealthy until the container restarts" when no latch can be kept."""
    result, _, _ = probe(make_interp("fatal", mode="fatal"), tmp_path, state=State.off("read-only file system"))
    assert result.reason == "cuda-fatal" and result.facts.get("latch_kept") is False, result
    assert "the latch could not be kept (state dir off: read-only file system)" in result.message, result.message
    assert "until the container restarts" not in result.message, result.message
