"""The bash front door (./healthcheck) and the suite behind it: what the suite tells it, and a stdout
that nobody reads (a real pipe, full)."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes import cli, deadlines, registry
from probes.config import DEFAULT_PROFILE
from probes.spec import PROFILE_RULES
from tests.conftest import ROOT, clean_env, suite_stub

pytestmark = pytest.mark.loaded  # under load too: make loaded (Makefile)

ALL_OFF = {t: "false" for t in registry.TOGGLES}


def full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full, as one is that nobody reads after enough output."""
    r, w = os.pipe()
    flags = fcntl.fcntl(w, fcntl.F_GETFL)
    fcntl.fcntl(w, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    for size in (4096, 1):  # writes up to PIPE_BUF are whole or refused: then byte by byte
        try:
            while True:
                os.write(w, b"x" * size)
        except BlockingIOError:
            pass
    fcntl.fcntl(w, fcntl.F_SETFL, flags)
    return r, w


def writers_gone(r: int, within: float) -> bool:
    """Whether every writer of the pipe has closed it (end of file after what it holds)."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        if select.select([r], [], [], left)[0] and os.read(r, 65536) == b"":
            return True
    return False


def run_into(w: int, argv: list[str], env: dict[str, str]) -> tuple[int, bytes, float]:
    """Run argv with stdout the pipe end ``w``; its exit status, stderr and how long it took."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=w, stderr=subprocess.PIPE, env=env, cwd=ROOT, start_new_session=True)
    os.close(w)
    try:
        _, err = proc.communicate(timeout=30)
        return proc.returncode, err, time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_full_stdout_that_nobody_reads_costs_the_report_never_the_verdict(tmp_path: Path):
    """The report waits a second at most for room (deadlines.WRITE_WAIT): a healthy run is still
    exit 0, an unhealthy one exit 1, both long before the hard deadline (1 s + 3 s), and nothing
    the run started still holds the pipe."""
    env = clean_env(HEALTHCHECK_PYTHON=sys.executable, HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                    HEALTHCHECK_TIMEOUT="1", **ALL_OFF)
    for extra, verdict in (({}, 0), ({"ENABLE_SSH_CHECK": "true", "HEALTHCHECK_SSH_PORT": "2"}, 1)):
        r, w = full_pipe()
        try:
            status, err, took = run_into(w, [str(ROOT / "healthcheck"), "-v"], {**env, **extra})
            assert (status, err) == (verdict, b""), err
            assert took < 1 + deadlines.WRITE_WAIT + 1.5, took
            assert writers_gone(r, within=2)
        finally:
            os.close(r)


ENTRY = ("import sys\nfrom probes.cli import entry\nentry(door=3)")  # as ./healthcheck starts the suite


@pytest.mark.parametrize(("args", "env", "said"), [
    *((["--profile", name], {}, deadlines.hard_stop(rules.timeout)) for name, rules in PROFILE_RULES.items()),
    ([], {}, deadlines.hard_stop(PROFILE_RULES[DEFAULT_PROFILE].timeout)),
    ([], {"HEALTHCHECK_TIMEOUT": " 2.5 ", "HEALTHCHECK_PROFILE": "liveness"}, 6),
    (["--profile", "nope"], {}, None), ([], {"HEALTHCHECK_TIMEOUT": "1e2"}, None),
])
def test_the_run_says_its_hard_deadline_to_the_front_door_before_any_child_starts(tmp_path: Path, args, env, said):
    """The hard deadline of its own settings (a bad one: nothing said, exit 200 + 3), on the descriptor
    it was given, which is closed before a drop-in (a child) runs: the line, then the end of the pipe,
    while the drop-in still sleeps."""
    checks = tmp_path / "checks"
    checks.mkdir()
    # A child in every profile: liveness runs a drop-in only when its header says so.
    (checks / "slow").write_text("#!/bin/sh\n# healthcheck: profiles=startup,readiness,liveness\nsleep 1\n")
    (checks / "slow").chmod(0o755)
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-I", "-c", ENTRY, *args], close_fds=False, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.dup2(w, 3),
                            env=clean_env(HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                                          HEALTHCHECK_CHECKS_DIR=str(checks), **ALL_OFF, **env))
    os.close(w)
    with os.fdopen(r, "rb") as door:
        text = door.read()  # to the end: every copy of the write end closed
        running = proc.poll() is None
    status = proc.wait(30)
    if said is None:
        assert (text, status) == (b"", cli.DOOR_EXIT + 3)
    else:
        assert (text, status) == (b"%d\n" % said, cli.DOOR_EXIT)
        assert running, "the descriptor stayed open until the run ended: the drop-in held it"


def test_an_interpreter_that_says_no_deadline_is_ended_at_the_start_up_bound(tmp_path: Path):
    """The front door's own numbers are the ladder's: TERM at FRONT_DOOR_START_UP, KILL
    FRONT_DOOR_KILL_AFTER later (here it ignores TERM), then its line at once."""
    py = suite_stub(tmp_path / "py", "trap '' TERM\nexec sleep 60")
    start = time.monotonic()
    res = subprocess.run([str(ROOT / "healthcheck")], env=clean_env(HEALTHCHECK_PYTHON=str(py)), cwd=ROOT,
                         capture_output=True, text=True, timeout=30, check=False)
    took = time.monotonic() - start
    assert (res.returncode, res.stdout) == (1, f"unhealthy: healthcheck: no hard deadline from the suite within "
                                               f"{deadlines.FRONT_DOOR_START_UP}s: its interpreter is stuck\n")
    bound = deadlines.FRONT_DOOR_START_UP + deadlines.FRONT_DOOR_KILL_AFTER
    assert bound <= took < bound + 1.5, took
