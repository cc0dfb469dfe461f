"""The bash front door (./healthcheck) writing to a stdout that nobody reads: a real pipe, full."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from probes import registry
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


def test_a_full_stdout_that_nobody_reads_still_gets_an_exit_status_by_the_hard_deadline(tmp_path: Path):
    """The suite's report blocks on the full pipe, so it never says its verdict: the front door
    ends it at the hard deadline (1 s + 3 s), and its own line, which cannot be written either,
    is given up after a second. Nothing it started still holds the pipe."""
    r, w = full_pipe()
    env = clean_env(HEALTHCHECK_PYTHON=sys.executable, HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                    HEALTHCHECK_TIMEOUT="1", **ALL_OFF)
    start = time.monotonic()
    proc = subprocess.Popen([str(ROOT / "healthcheck"), "-v"], stdout=w, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT, start_new_session=True)
    os.close(w)
    try:
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        assert proc.returncode == 1, err
        assert err == b""
        # The hard stop at 4 s; the suite's end after its SIGTERM (its KILL a second later at
        # most); the front door's own line given up after a second.
        assert took < 4 + 2 + 1 + 1, took
        assert writers_gone(r, within=2)
    finally:
        os.close(r)
