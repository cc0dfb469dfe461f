"""The nccl probe: the real CPU torch (no NCCL), the worker's own contribution and verification
through a real gloo group on loopback, and stub workers that hang, ignore TERM or print NCCL's own
warning texts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from probes import config as config_mod
from probes.config import Config
from probes.context import Context
from probes.framework import deep, nccl, nccl_worker
from probes.result import Result, Status
from probes.state import State
from tests.servers import free_port

from .conftest import REAL_PYTHON

# NCCL's own WARN lines (misc/shmutils.cc, transport/p2p.cc), as NCCL_DEBUG=WARN prints them.
SHM_WARN = ("node1:4242:4250 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-aB3dEf "
            "to 9637892 bytes, error: No space left on device (28)\n"
            "node1:4242:4250 [0] misc/shmutils.cc:110 NCCL WARN Error while creating shared memory segment "
            "/dev/shm/nccl-aB3dEf (size 9637888), error: No space left on device (28)")
P2P_WARN = ("node1:4242:4251 [1] transport/p2p.cc:275 NCCL WARN Cuda failure 'peer access is not supported "
            "between these two devices'")
PASSING = {"v": nccl_worker.SCHEMA, "backend": "nccl", "torch": "2.13.0", "nccl": "2.21.5", "count": 2, "ms": 1.5, "bad": 0,
           "max_err": 0.0, "error": None}


def run_probe(tmp_path: Path, python: object = REAL_PYTHON, *, profile: str = "readiness",
              timeout: float = 60.0, state: State | None = None, results: dict[str, Result] | None = None,
              **settings: Any) -> tuple[Result, dict[str, Any], float]:
    settings.setdefault("nccl_min_shm_mib", 0)
    cfg = Config()._replace(profile=profile, torch_python=str(python), torch_device="cuda", **settings)
    st = state if state is not None else State.open(str(tmp_path / "state"))
    start = time.monotonic()
    ctx = Context(cfg, start + timeout, dict(results or {}), st)
    data = nccl.gather(ctx)
    return nccl.judge(data, ctx), data, time.monotonic() - start


def stub(make_interp: Any, name: str, stderr: str = "", phase: str = "allreduce", then: str = "sleep 300",
         trap: bool = False) -> Any:
    lines = []
    if trap:
        lines.append('trap "" TERM')
    lines.append(f'echo "{nccl_worker.PHASE}{phase}" >&2')
    for line in stderr.splitlines():
        lines.append(f"echo \"{line}\" >&2")
    lines.append(then)
    return make_interp(name, body="\n".join(lines))


def test_cpu_torch_has_no_nccl(tmp_path: Path) -> None:
    result, data, _ = run_probe(tmp_path)
    assert result.status is Status.FAIL and result.reason == "no-nccl", result.message
    assert "NCCL is not available in this torch build" in result.message
    assert data["report"]["torch"] == torch.__version__


# One rank of a real gloo all-reduce of the worker's own contribution, checked by its own verify().
GLOO_RANK = """import json, runpy, sys
import torch, torch.distributed as dist
worker = runpy.run_path(sys.argv[1])
world, rank = int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo", init_method=sys.argv[4], world_size=world, rank=rank)
t = worker["contribution"](torch, rank)
dist.all_reduce(t)
print(json.dumps(worker["verify"](torch, [t], world)))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("world", [1, 2])
def test_the_checking_code_verifies_a_real_gloo_all_reduce(world: int) -> None:
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([REAL_PYTHON, "-c", GLOO_RANK, nccl_worker.__file__, str(world), str(rank), init],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for rank in range(world)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert json.loads(out.decode().splitlines()[-1]) == [0, 0.0]


def test_verify_catches_a_wrong_sum_and_a_missing_rank() -> None:
    good = nccl_worker.expected(torch, 3)
    assert nccl_worker.verify(torch, [good.clone(), good.clone()], 3) == (0, 0.0)
    flipped = good.clone()
    flipped[1234] += 1.0
    assert nccl_worker.verify(torch, [good.clone(), flipped], 3) == (1, 1.0)
    # a rank's contribution missing: the sum of 2 ranks where 3 were expected
    two = nccl_worker.contribution(torch, 0) + nccl_worker.contribution(torch, 1)
    bad, err = nccl_worker.verify(torch, [two], 3)
    assert bad == 1 and err > 0
    nan = good.clone()
    nan[0] = float("nan")
    assert nccl_worker.verify(torch, [nan], 3)[0] == 1


@pytest.mark.parametrize("name, kw, reason", [
    ("hang", {}, "nccl-hang"),
    ("deaf", {"trap": True, "then": "sleep 300 & sleep 300\nwait"}, "nccl-hang"),
    ("shm", {"stderr": SHM_WARN}, "shm-too-small"),
    ("p2p", {"stderr": P2P_WARN, "trap": True}, "p2p"),
    ("import", {"phase": "import"}, "deadline"),
])
def test_stub_workers_are_diagnosed_by_the_deadline(tmp_path: Path, make_interp: Any, marker: Any, name: str,
                                                    kw: dict[str, Any], reason: str) -> None:
    interp = stub(make_interp, name, **kw)
    result, _, took = run_probe(tmp_path, interp, timeout=2.5)
    assert result.status is Status.FAIL and result.reason == reason, result.message
    assert took < 8, took
    assert marker() == []
    if reason == "shm-too-small":
        assert "--shm-size" in result.message and "failed to extend /dev/shm/nccl-aB3dEf" in result.message
    if reason in ("p2p", "nccl-hang"):
        assert "NCCL_P2P_DISABLE=1" in result.message and "IOMMU/ACS" in result.message


def test_warning_then_exit_is_diagnosed_too(tmp_path: Path, make_interp: Any, marker: Any) -> None:
    interp = stub(make_interp, "shm-exit", stderr=SHM_WARN, then="exit 1")
    result, _, _ = run_probe(tmp_path, interp)
    assert result.reason == "shm-too-small", result.message
    assert marker() == []


def test_small_dev_shm_fails_before_any_worker(tmp_path: Path, make_interp: Any) -> None:
    interp = make_interp("py")
    result, data, _ = run_probe(tmp_path, interp, nccl_min_shm_mib=2**30)
    assert result.status is Status.FAIL and result.reason == "shm-too-small"
    assert interp.starts == 0 and data["shm"] == nccl.shm_size()


def test_a_pass_is_reused_by_readiness_for_the_ttl(tmp_path: Path, make_interp: Any) -> None:
    line = nccl_worker.PREFIX + json.dumps(PASSING)
    interp = make_interp("ok", body=f"echo '{line}'")
    first, _, _ = run_probe(tmp_path, interp)
    assert first.status is Status.PASS, first.message
    assert "NCCL 2.21.5 all-reduce over 2 GPU(s) exact" in first.message and first.observed == 1.5
    second, data, _ = run_probe(tmp_path, interp)
    assert second.status is Status.PASS and data["cache"]["how"] == "ttl" and interp.starts == 1
    run_probe(tmp_path, interp, profile="startup")
    assert interp.starts == 2
    run_probe(tmp_path, interp, nccl_ttl=0)
    assert interp.starts == 3


def test_dev_shm_is_checked_before_a_cached_pass_is_reused(tmp_path: Path, make_interp: Any) -> None:
    interp = make_interp("ok", body=f"echo '{nccl_worker.PREFIX + json.dumps(PASSING)}'")
    assert run_probe(tmp_path, interp)[0].status is Status.PASS
    result, _, _ = run_probe(tmp_path, interp, nccl_min_shm_mib=2**30)
    assert result.reason == "shm-too-small" and interp.starts == 1, result.message


def test_a_wrong_sum_fails_and_is_not_reused(tmp_path: Path, make_interp: Any) -> None:
    line = nccl_worker.PREFIX + json.dumps({**PASSING, "bad": 1, "max_err": 2.0})
    interp = make_interp("bad", body=f"echo '{line}'")
    result, _, _ = run_probe(tmp_path, interp)
    assert result.reason == "wrong-result"
    run_probe(tmp_path, interp)
    assert interp.starts == 2


def test_shares_the_one_costly_check_lock_with_torch_cuda(tmp_path: Path, make_interp: Any) -> None:
    interp = make_interp("py")
    state = State.open(str(tmp_path / "state"))
    with state.lock(deep.LOCK, time.monotonic() + 5) as held:
        assert held
        result, _, took = run_probe(tmp_path, interp, timeout=1.5, state=state)
    assert result.reason == "deadline" and "holds the lock" in result.message
    assert interp.starts == 0 and took < 5


def test_off_by_default_and_never_in_liveness(tmp_path: Path) -> None:
    env = {"HEALTHCHECK_CHECKS_DIR": str(tmp_path / "none")}
    assert "nccl" not in [s.name for s in config_mod.load(env).selected()]
    assert "nccl" in [s.name for s in config_mod.load({**env, "ENABLE_NCCL_CHECK": "true"}).selected()]
    live = config_mod.load({**env, "ENABLE_NCCL_CHECK": "true", "HEALTHCHECK_PROFILE": "liveness"})
    assert "nccl" not in [s.name for s in live.selected()]


def test_cpu_device_is_not_judged(tmp_path: Path, make_interp: Any) -> None:
    interp = make_interp("py")
    cfg = Config()._replace(torch_python=str(interp), torch_device="cpu")
    ctx = Context(cfg, time.monotonic() + 5, {}, State.open(str(tmp_path / "state")))
    result = nccl.judge(nccl.gather(ctx), ctx)
    assert result.status is Status.SKIP and interp.starts == 0


def parse(line: bytes) -> tuple[Any, str | None]:
    return deep.parse(line, nccl_worker.PREFIX, nccl.validate)


def test_the_result_line_is_validated() -> None:
    ok = (nccl_worker.PREFIX + json.dumps(PASSING) + "\n").encode()
    assert parse(ok)[0] is not None
    for bad in ({**PASSING, "bad": "0"}, {**PASSING, "x": 1}, {**PASSING, "backend": "gloo"},
                {**PASSING, "error": {"kind": "boom", "type": "t", "message": "m"}}):
        assert parse((nccl_worker.PREFIX + json.dumps(bad) + "\n").encode())[0] is None
    assert nccl.warnings(b"x NCCL WARN a\x1b[2Jb\n") == ["a\\x1b[2Jb"]


@pytest.mark.gpu
def test_real_nccl_all_reduce_on_the_gpus(tmp_path: Path) -> None:
    if not torch.cuda.is_available():  # a stub nvidia-smi (make gpu-verify FAKE=1) passes the marker's check
        pytest.skip("needs CUDA: this torch has no GPU")
    result, data, _ = run_probe(tmp_path, sys.executable, profile="startup")
    assert result.status is Status.PASS, result.message
    assert data["report"]["count"] >= 1 and data["report"]["nccl"]


def test_a_sticky_cuda_error_known_only_by_its_number_latches(tmp_path: Path, make_interp: Any) -> None:
    """torch 2.8+ names a CUDA error by ``error_code``; a message the table does not know leaves the
    number as the only evidence, and it must reach the judge as a number."""
    error = {"kind": "collective", "type": "AcceleratorError", "message": "the all-reduce failed", "code": 700}
    line = tmp_path / "line"
    line.write_text(nccl_worker.PREFIX + json.dumps({**PASSING, "count": None, "ms": None, "bad": None,
                                                     "max_err": None, "error": error}) + "\n")
    interp = make_interp("sticky", body=f'cat "{line}"')
    state = State.open(str(tmp_path / "state"))
    result, data, _ = run_probe(tmp_path, interp, state=state)
    assert data["report"]["error"]["code"] == 700
    assert result.status is Status.FAIL and result.reason == "cuda-fatal", result.message
    latch = state.latch()
    assert latch is not None and latch["source"] == "nccl", latch
