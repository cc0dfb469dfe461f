"""Injected faults, many times over: nothing is left running and no file descriptor leaks.

About 1,300 runs in all: most are in-process (probes.proc.run, probes.runner.run with the
real probe modules) so that this process's own descriptors and threads can be counted;
a smaller number are whole processes through the front door, as Docker runs them.
Faults live only at the boundary: stub nvidia-smi executables, a stand-in for the image's
python, the fake libnvidia-ml.so.1, a loopback server that never answers. Among them,
descendants that leave the child's session or group (a setsid grandchild, a double-forking
daemon, a fork storm of 100, a SIGTERM handler that forks): none may outlive its run.
"""

from __future__ import annotations

import concurrent.futures
import gc
import os
import subprocess
import time
from pathlib import Path

import pytest

from probes import proc, runner
from probes.config import load
from probes.result import Status
from probes.state import State
from tests.conftest import ROOT, clean_env
from tests.servers import described, wait_gone
from tests.stress.conftest import (
    SMI,
    TORCH,
    VENV_PY,
    descendants,
    fake_nvml_env,
    fd_count,
    kill_all,
    write_exe,
)

pytestmark = pytest.mark.stress

SLACK = 0.5  # a call returns by its deadline + 0.5 s
PROC_RUNS = 960  # 80 per stub behaviour
RUNNER_RUNS = 200
WHOLE_RUNS = 110  # 10 per fault
DESCENDANTS = ("setsid", "double-fork", "storm", "term-fork")
THREADS = 4


def queued() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (/proc/thread-self/schedstat):
    a bound on how late a call returns is about the suite, not about a machine that kept the
    caller off every core, so the time the caller waited in the run queue is not the call's."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def thread_count() -> int:
    """This process's threads as the kernel counts them: the runner starts its own with
    _thread, which threading.active_count() does not see."""
    return len(os.listdir("/proc/self/task"))


def _settle_threads(baseline: int, within: float = 3.0) -> int:
    end = time.monotonic() + within
    while thread_count() > baseline and time.monotonic() < end:
        time.sleep(0.05)
    return thread_count()


def _baseline() -> tuple[int, int, set[int]]:
    """Open file descriptors, live threads and child processes before a batch of runs."""
    return fd_count(), thread_count(), descendants()


def _assert_nothing_leaked(problems: list[str], runs: int, marker: str,
                           before: tuple[int, int, set[int]]) -> None:
    """After a batch of runs: every run behaved, and no process, descriptor or thread remains."""
    fds, threads, kids = before
    found = wait_gone(marker)
    left = described(found)  # as found: once killed below, a leftover reads as a zombie
    kill_all(found)
    gc.collect()
    assert not problems, f"{len(problems)} of {runs} runs misbehaved, e.g. {problems[:5]}"
    assert not left, f"{len(left)} processes left behind: {left[:5]}"
    assert descendants() - kids == set(), "children of this process were left behind"
    assert fd_count() == fds, f"file descriptors: {fds} before, {fd_count()} after {runs} runs"
    assert _settle_threads(threads) == threads, "threads were left behind"


def test_proc_run_faults_leave_no_process_and_no_fd(tmp_path: Path, marker: str) -> None:
    stubs = {name: write_exe(tmp_path / f"smi-{name}", body.format(m=marker)) for name, body in SMI.items()}
    names = sorted(stubs)
    # Expected: (times out, exit status) per behaviour; None = not checked.
    expect = {"ok": (False, 0), "exit9": (False, 9), "hang": (True, None), "ignore-term": (True, None),
              "grandchild": (False, 0), "own-group": (True, None), "huge": (False, 0), "signal": (False, -11),
              # Descendants that leave the child's session or group (tests/descendants.py).
              "setsid": (False, 0), "double-fork": (False, 0), "storm": (True, None),
              "term-fork": (True, None)}
    # A stub that hangs meets a short deadline; one that answers gets a deadline it never needs,
    # so that its verdict is about its answer, not about how soon a busy machine ran it.
    short, ample = 0.15, 3.0

    def one(i: int) -> str | None:
        name = names[i % len(names)]
        timed_out, code = expect[name]
        deadline_s = short if timed_out else ample
        waited = queued()
        start = time.monotonic()
        res = proc.run([str(stubs[name])], deadline=start + deadline_s)
        took = time.monotonic() - start - (queued() - waited)
        if took > deadline_s + SLACK:
            return f"{name}: took {took:.2f}s with a {deadline_s}s deadline"
        if res.timed_out != timed_out:
            return f"{name}: timed_out={res.timed_out}"
        if code is not None and res.returncode != code:
            return f"{name}: exit {res.returncode}, expected {code}"
        if name == "huge" and not (res.truncated and len(res.stdout) == proc.MAX_OUTPUT):
            return f"huge: {len(res.stdout)} bytes kept, truncated={res.truncated}"
        if name in ("ok", "grandchild", "setsid", "double-fork") and b"NVIDIA H100" not in res.stdout:
            return f"{name}: answer lost: {res.stdout[:80]!r}"
        return None

    for i in range(len(names)):  # warm up (lazy imports, first selector) before the baseline
        one(i)
    assert not wait_gone(marker)
    gc.collect()
    before = _baseline()

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        problems = [p for p in pool.map(one, range(PROC_RUNS)) if p]

    _assert_nothing_leaked(problems, PROC_RUNS, marker, before)


def test_runner_with_faulty_probes_leaves_no_process_fd_or_thread(
        tmp_path: Path, marker: str, monkeypatch: pytest.MonkeyPatch, sshd_port: int, silent_port: int) -> None:
    """The real runner and probe modules, a stub nvidia-smi and a stand-in torch python per fault."""
    smi_bins = {}
    for name in ("ok", "exit9", "hang", "ignore-term", "grandchild", "own-group", *DESCENDANTS):
        d = tmp_path / f"bin-{name}"
        write_exe(d / "nvidia-smi", SMI[name].format(m=marker))
        smi_bins[name] = d
    torches = {n: write_exe(tmp_path / f"torch-{n}", b.format(m=marker)) for n, b in TORCH.items()}
    smi_names, torch_names = sorted(smi_bins), sorted(torches)
    base_path = os.environ.get("PATH", "/usr/bin:/bin")
    # The probes inherit this process's environment: one dispatcher on PATH picks the stub
    # named by $SMI, so PATH stays put while the behaviour changes from run to run.
    all_bin = tmp_path / "bin-dispatch"
    dispatch = "\n".join(f'[ "$SMI" = {n} ] && exec {smi_bins[n]}/nvidia-smi "$@"' for n in smi_names)
    write_exe(all_bin / "nvidia-smi", dispatch + "\nexit 99")
    monkeypatch.setenv("PATH", f"{all_bin}:{base_path}")
    timeout = 0.4

    def one(i: int) -> str | None:
        smi = smi_names[i % len(smi_names)]
        torch = torch_names[(i // len(smi_names)) % len(torch_names)]
        ssh_port = sshd_port if i % 3 else silent_port
        env = {"HEALTHCHECK_TIMEOUT": str(timeout), "HEALTHCHECK_TORCH_DEVICE": "cpu",
               "HEALTHCHECK_TORCH_PYTHON": str(torches[torch]), "HEALTHCHECK_SSH_PORT": str(ssh_port),
               "HEALTHCHECK_GPU_COUNT": "1"}
        cfg = load(env, profile="startup", only="nvidia-smi,torch-cuda,ssh")
        monkeypatch.setenv("SMI", smi)  # read by the dispatcher stub (runs are sequential)
        waited = queued()
        start = time.monotonic()
        out = runner.run(cfg, State.off("stress"))
        took = time.monotonic() - start - (queued() - waited)
        got = {r.name: r for r in out.results}
        if took > timeout + SLACK:
            return f"{smi}/{torch}: runner took {took:.2f}s with a {timeout}s budget"
        if set(got) != {"nvidia-smi", "torch-cuda", "ssh"}:
            return f"{smi}/{torch}: results for {sorted(got)}"
        if got["torch-cuda"].status is Status.PASS:
            return f"{smi}/{torch}: a broken torch passed"
        if (got["ssh"].status is Status.PASS) != (ssh_port == sshd_port):
            return f"ssh on {'silent' if ssh_port == silent_port else 'sshd'} port: {got['ssh'].status}"
        return None

    # Runs are sequential (the stub is chosen through this process's environment); the
    # runner's own threads already run the probes concurrently.
    for i in range(len(smi_names)):
        one(i)
    assert not wait_gone(marker)
    gc.collect()
    before = _baseline()

    problems = [p for p in (one(i) for i in range(RUNNER_RUNS)) if p]

    _assert_nothing_leaked(problems, RUNNER_RUNS, marker, before)


WHOLE_FAULTS = [
    # (name, stub nvidia-smi, stand-in torch, NVML scenario lines, profile)
    ("smi-hang", "hang", None, None, "readiness"),
    ("smi-ignore-term", "ignore-term", None, None, "readiness"),
    ("smi-grandchild-and-own-group", "own-group", None, None, "readiness"),
    ("nvml-hang", "ok", None, "hang nvmlInit", "readiness"),
    ("nvml-count-hang", "ok", None, "hang nvmlDeviceGetCount_v2", "startup"),
    ("torch-hang", None, "hang", None, "startup"),
    # Descendants that leave the child's session or group, from nvidia-smi and the worker.
    ("smi-storm", "storm", None, None, "readiness"),
    ("smi-term-fork", "term-fork", None, None, "readiness"),
    ("torch-setsid", None, "setsid", None, "startup"),
    ("torch-double-fork", None, "double-fork", None, "startup"),
    ("torch-storm", None, "storm", None, "startup"),
]


def test_whole_process_faults_answer_and_leave_nothing(tmp_path: Path, marker: str) -> None:
    nvml = fake_nvml_env()
    faults = [f for f in WHOLE_FAULTS if f[3] is None or nvml is not None]
    timeout = 1.0
    jobs = []
    for name, smi, torch, scenario, profile in faults:
        d = tmp_path / name
        env = clean_env(HEALTHCHECK_PYTHON=VENV_PY, HEALTHCHECK_TIMEOUT=str(timeout),
                        HEALTHCHECK_STATE_DIR=str(d / "state"), HEALTHCHECK_TORCH_DEVICE="cpu",
                        ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false", HEALTHCHECK_GPU_COUNT="1")
        if smi:
            write_exe(d / "bin" / "nvidia-smi", SMI[smi].format(m=marker))
            env["PATH"] = f"{d / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        if scenario:
            (d / "scenario").write_text(scenario + "\n")
            env.update(nvml or {}, FAKE_NVML_SCENARIO=str(d / "scenario"))
        elif nvml is None:
            env["ENABLE_GPU_CHECK"] = "false" if not smi else "true"
        if torch:
            env["HEALTHCHECK_TORCH_PYTHON"] = str(write_exe(d / "torch", TORCH[torch].format(m=marker)))
            env.setdefault("ENABLE_GPU_CHECK", "false")
        else:
            env["ENABLE_TORCH_CHECK"] = "false"
        jobs.append((name, profile, env))

    def one(i: int) -> str | None:
        name, profile, env = jobs[i % len(jobs)]
        start = time.monotonic()
        r = subprocess.run([str(ROOT / "healthcheck"), "--profile", profile], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=30, check=False)
        took = time.monotonic() - start
        first = (r.stdout.splitlines() or [""])[0]
        if r.returncode != 1 or not first.startswith("unhealthy:"):
            return f"{name}: exit {r.returncode}: {first[:160]} {r.stderr[-200:]}"
        if "Traceback" in r.stdout + r.stderr or len(r.stdout.encode()) >= 4096:
            return f"{name}: traceback or oversized output"
        # Interpreter start-up is outside the suite's own clock: allow it on a loaded machine.
        if took > timeout + SLACK + 1.0:
            return f"{name}: answered after {took:.2f}s with HEALTHCHECK_TIMEOUT={timeout}"
        return None

    kids = descendants()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        problems = [p for p in pool.map(one, range(WHOLE_RUNS)) if p]
    found = wait_gone(marker, within=3.0)
    left = described(found)
    kill_all(found)
    assert not problems, f"{len(problems)} of {WHOLE_RUNS} runs misbehaved, e.g. {problems[:3]}"
    assert not left, f"{len(left)} processes left behind: {left[:5]}"
    assert descendants() - kids == set()
