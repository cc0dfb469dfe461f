"""The bash front door (./healthcheck) and the suite writing to a stdout that nobody reads: a real pipe, full."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from probes import deadlines, registry
from tests.conftest import ROOT, clean_env

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
