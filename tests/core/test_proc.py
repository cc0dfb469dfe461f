"""The process helper: children that hang, ignore SIGTERM or leave grandchildren holding the pipe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from probes import childio, proc
from tests.conftest import ROOT
from tests.servers import leftovers, wait_gone

pytestmark = pytest.mark.loaded  # under load too: make loaded (Makefile)

SLACK = 0.5  # the bound: a probe returns at its deadline + 0.5 s at most


@pytest.fixture
def marker() -> str:
    return f"hc-test-{uuid.uuid4().hex[:12]}"


def sh(script: str, marker: str) -> list[str]:
    # The marker travels as $0 so every process of the tree carries it in its command line.
    return ["sh", "-c", script, marker]


def timed(argv: list[str], budget: float) -> tuple[proc.Completed, float]:
    start = time.monotonic()
    res = proc.run(argv, deadline=start + budget)
    return res, time.monotonic() - start


def test_plain_success_keeps_output_and_status(marker):
    res, _ = timed(sh("echo out; echo err >&2; exit 7", marker), 5)
    assert res.returncode == 7 and res.stdout == b"out\n" and res.stderr == b"err\n"
    assert not res.timed_out and not res.stuck and res.returncode != 0


def test_hanging_child_returns_at_deadline_and_is_gone(marker):
    res, took = timed(sh("echo started; exec sleep 60", marker), 0.5)
    assert res.timed_out and res.signal == signal.SIGTERM
    assert res.stdout == b"started\n"
    assert 0.5 <= took <= 0.5 + SLACK
    assert wait_gone(marker) == []


def test_child_ignoring_sigterm_is_killed(marker):
    res, took = timed(sh("trap '' TERM; while :; do sleep 0.05; done", marker), 0.5)
    assert res.timed_out and res.signal == signal.SIGKILL
    assert took <= 0.5 + SLACK
    assert wait_gone(marker) == []


def test_grandchild_holding_stdout_does_not_hold_us(marker):
    res, took = timed(sh("sleep 60 & echo parent-done", marker), 5)
    assert res.returncode == 0 and not res.timed_out
    assert b"parent-done" in res.stdout
    assert took < 1.0
    assert wait_gone(marker) == []


def test_grandchild_in_its_own_group_is_swept(marker):
    script = "python3 -c 'import os,time; os.setpgid(0,0); time.sleep(60)' & sleep 60"
    res, took = timed(sh(script, marker), 0.5)
    assert res.timed_out and took <= 0.5 + SLACK
    assert wait_gone(marker) == []


def test_huge_output_is_capped(marker):
    res, _ = timed(sh("head -c 5000000 /dev/zero", marker), 10)
    assert res.returncode == 0 and res.truncated
    assert len(res.stdout) == proc.MAX_OUTPUT


def test_missing_and_unexecutable_programs(tmp_path):
    assert proc.run(["no-such-program-xyz"], deadline=time.monotonic() + 1).spawn_error == "not found"
    script = tmp_path / "noexec"
    script.write_text("#!/bin/sh\n")
    res = proc.run([str(script)], deadline=time.monotonic() + 1)
    assert res.spawn_error == "permission denied" and res.returncode is None and not res.stuck


def test_killed_by_signal_is_reported(marker):
    res, _ = timed(sh("kill -SEGV $$", marker), 5)
    assert res.signal == signal.SIGSEGV and not res.timed_out


def unkillable(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if every process were in uninterruptible sleep: the kernel boundary, the signal system
    calls, drops our signals (kill, killpg and a pidfd's)."""
    for name in ("kill", "killpg"):
        monkeypatch.setattr(os, name, lambda *a: None)
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda *a: None, raising=False)


def test_unkillable_child_is_reported_stuck_not_awaited(monkeypatch, marker):
    """A process in uninterruptible sleep ignores SIGKILL; the helper must still return within its bound."""
    unkillable(monkeypatch)
    res, took = timed([sys.executable, "-c", "import time; time.sleep(60)", marker], 0.3)
    monkeypatch.undo()
    try:
        assert res.timed_out and res.stuck and res.returncode is None
        assert took <= 0.3 + SLACK
    finally:
        for p in leftovers(marker):
            os.kill(p.pid, signal.SIGKILL)


def test_no_file_descriptor_leak(marker):
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        proc.run(sh("sleep 5 & echo x", marker), deadline=time.monotonic() + 2)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_stuck_child_is_remembered_and_not_started_again(monkeypatch, marker, tmp_path):
    """While an earlier child under the same key survives SIGKILL, no new one is started:
    piling processes onto a wedged driver on every probe would only make things worse."""
    from probes.state import State

    state = State.open(str(tmp_path / "state"))
    argv = [sys.executable, "-c", "import time; time.sleep(60)", marker]
    unkillable(monkeypatch)
    first = proc.run(argv, deadline=time.monotonic() + 0.3, state=state, key="tool")
    monkeypatch.undo()
    stuck = [p.pid for p in leftovers(marker)]
    try:
        assert first.stuck and len(stuck) == 1 and first.held_by is None
        start = time.monotonic()
        second = proc.run(argv, deadline=time.monotonic() + 5, state=state, key="tool")
        assert second.stuck and second.held_by == stuck[0]
        assert time.monotonic() - start < 0.2
        assert len(leftovers(marker)) == 1  # nothing new was started
        other = proc.run(["true"], deadline=time.monotonic() + 5, state=state, key="other")
        assert other.returncode == 0  # another key is not held back
    finally:
        for pid in stuck:
            os.kill(pid, signal.SIGKILL)
    assert wait_gone(marker) == []
    third = proc.run(["true"], deadline=time.monotonic() + 5, state=state, key="tool")
    assert third.returncode == 0 and third.held_by is None  # the stuck one is gone: start again


def test_stderr_flood_with_a_valid_stdout_is_not_truncated_output(marker):
    """Megabytes on stderr are cut silently: stdout, the answer, stays whole and untruncated."""
    res, _ = timed(sh("echo answer; head -c 3000000 /dev/zero >&2", marker), 10)
    assert res.returncode == 0 and res.stdout == b"answer\n"
    assert not res.truncated and res.stderr_truncated
    assert len(res.stderr) == childio.MAX_STDERR


def test_max_output_applies_to_stdout_per_call(marker):
    res, _ = timed(sh("head -c 100 /dev/zero; head -c 100 /dev/zero >&2", marker), 5)
    assert not res.truncated and not res.stderr_truncated
    res = proc.run(sh("head -c 100 /dev/zero; head -c 100 /dev/zero >&2", marker),
                   deadline=time.monotonic() + 5, max_output=10)
    assert res.truncated and len(res.stdout) == 10
    assert not res.stderr_truncated and len(res.stderr) == 100


def test_until_ends_a_child_that_answers_but_does_not_exit(marker):
    res, took = timed_until(sh("echo RESULT done; exec sleep 60", marker), 10, b"RESULT", linger=0.3)
    assert res.timed_out and res.lingered and res.stdout == b"RESULT done\n"
    assert 0.3 <= took <= 0.3 + SLACK  # the linger, not the 10 s deadline
    assert wait_gone(marker) == []


def test_until_lets_a_child_that_exits_after_its_answer_finish(marker):
    res, took = timed_until(sh("echo RESULT done; sleep 0.2; echo bye; exit 4", marker), 10, b"RESULT",
                            linger=2.0)
    assert res.returncode == 4 and not res.timed_out and not res.lingered
    assert res.stdout == b"RESULT done\nbye\n" and took < 2.0


def test_until_not_met_is_a_plain_deadline(marker):
    res, took = timed_until(sh("echo partial; exec sleep 60", marker), 0.5, b"RESULT", linger=5)
    assert res.timed_out and not res.lingered and took <= 0.5 + SLACK
    assert wait_gone(marker) == []


def test_linger_never_passes_the_deadline(marker):
    res, took = timed_until(sh("echo RESULT; exec sleep 60", marker), 0.5, b"RESULT", linger=30)
    assert res.timed_out and res.lingered and took <= 0.5 + SLACK


def timed_until(argv: list[str], budget: float, needle: bytes, linger: float) -> tuple[proc.Completed, float]:
    start = time.monotonic()
    res = proc.run(argv, deadline=start + budget, until=lambda out: needle in out, linger=linger)
    return res, time.monotonic() - start


def test_a_pid_whose_process_started_at_another_time_is_never_signalled():
    from probes import pidstat

    child = subprocess.Popen(["sleep", "30"])
    try:
        start = pidstat.stat(child.pid).start
        assert not pidstat.signal_same(child.pid, start + 1, signal.SIGTERM)  # as if the pid were reused
        assert child.poll() is None
        assert pidstat.signal_same(child.pid, start, signal.SIGTERM)
        assert child.wait(5) == -signal.SIGTERM
        assert not pidstat.signal_same(child.pid, start, signal.SIGTERM)
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may run a child as another user")
def test_a_child_run_as_another_user_keeps_no_group_of_ours(marker):
    res = proc.run(sh("id -u; id -g; id -G", marker), deadline=time.monotonic() + 5, user=(4242, 4343))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [b"4242", b"4343", b"4343"]


def test_logging_is_imported_before_the_first_child_is_forked():
    """logging registers a before-fork and an after-fork hook when it is imported; imported by another
    thread while a child is being forked (between the hooks the fork waits for the import lock with the
    interpreter lock let go), its after-fork hook runs alone and prints "Exception ignored in:
    <function _releaseLock>" and a traceback into the report. Each fork finds it imported already."""
    script = ("import os, sys, time\nseen = []\n"
              "os.register_at_fork(before=lambda: seen.append('logging' in sys.modules))\n"
              "from probes import proc\n"
              "done = proc.run(['/bin/true'], deadline=time.monotonic() + 10)\n"
              "print(done.returncode, seen)\n")
    res = subprocess.run([sys.executable, "-I", "-c", script], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.stdout.split(None, 1) == ["0", "[True]\n"], res.stdout + res.stderr
