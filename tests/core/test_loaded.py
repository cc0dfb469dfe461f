"""tests/loaded.sh, the runner of `make loaded`: a busy loop per core while a command runs, and
none left running however the command or the runner ends (a failure, an interrupt, a SIGKILL)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tests.conftest import ROOT

LOADED = ROOT / "tests" / "loaded.sh"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def left_running(pids: list[int], within: float = 2.0) -> list[int]:
    """A SIGKILL is delivered asynchronously: a moment before calling a loop a leftover."""
    end = time.monotonic() + within
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def hogs(stderr: str) -> list[int]:
    found = re.search(r"busy loops \(pids ([\d ]+)\)", stderr)
    assert found, stderr
    return [int(p) for p in found.group(1).split()]


def as_at_a_terminal() -> None:
    """SIGINT as a foreground job at a terminal has it: a runner started in the background of a
    script (nohup, CI) inherits SIGINT ignored, and a shell cannot trap what it got ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(tmp_path: Path, script: str) -> tuple[subprocess.Popen[bytes], Path]:
    err = tmp_path / "stderr"
    proc = subprocess.Popen(["bash", str(LOADED), "sh", "-c", script], stderr=err.open("wb"),
                            start_new_session=True, preexec_fn=as_at_a_terminal)
    return proc, err


def end_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < end, "the command never started"
        time.sleep(0.05)


def test_one_loop_per_core_runs_beside_the_command_and_its_failure_is_the_status(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(LOADED), "sh", "-c", "cat /proc/loadavg >/dev/null; exit 7"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 7, done.stderr
    pids = hogs(done.stderr)
    assert len(pids) == os.cpu_count() or len(pids) == len(os.sched_getaffinity(0))
    assert left_running(pids) == []


def test_an_interrupt_ends_the_loops(tmp_path: Path) -> None:
    """^C at a terminal: SIGINT to the whole foreground process group."""
    ready = tmp_path / "ready"
    proc, err = start(tmp_path, f"touch {ready}; sleep 30")
    try:
        wait_for(ready, proc)
        pids = hogs(err.read_text())
        assert all(alive(p) for p in pids)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(10) == -signal.SIGINT
        assert left_running(pids) == []
    finally:
        end_group(proc)


def test_a_killed_runner_leaves_no_loop(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc, err = start(tmp_path, f"touch {ready}; sleep 30")
    try:
        wait_for(ready, proc)
        pids = hogs(err.read_text())
        assert all(alive(p) for p in pids)
        proc.kill()  # the runner alone, as an OOM killer would
        proc.wait(10)
        assert left_running(pids) == []
    finally:
        end_group(proc)  # the command, which outlives its runner
