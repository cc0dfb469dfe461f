"""Resource limits as runtimes set them: a low open-file limit (prlimit), a low process limit
(RLIMIT_NPROC, which binds only a non-root user: setpriv to an arbitrary uid). What the suite
cannot start is "not checked" with the limit named, never a script's fault, a deadline or a
traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes import registry
from tests.conftest import ROOT, clean_env

ALL_OFF = {t: "false" for t in registry.TOGGLES}
UID = 12345  # an arbitrary user without processes of its own: RLIMIT_NPROC counts only the suite's


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A mode-755 directory right under /tmp: few path components, so that opening the checks dir
    (one descriptor per component) needs fewer descriptors than starting a child; readable by
    another uid."""
    base = Path(tempfile.mkdtemp(prefix="hcl-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def drop_ins(base: Path, count: int) -> Path:
    checks = base / "d"
    checks.mkdir(mode=0o755)
    for i in range(count):
        path = checks / f"c{i}"
        path.write_text(f"#!/bin/sh\necho fine {i}\n")
        path.chmod(0o755)
    return checks


def run(prefix: list[str], checks: Path, state: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = clean_env(HEALTHCHECK_CHECKS_DIR=str(checks), HEALTHCHECK_STATE_DIR=str(state), **ALL_OFF)
    out = subprocess.run([*prefix, sys.executable, "-m", "probes", "--json"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stdout + out.stderr
    return out, json.loads(out.stdout)["checks"]


def limited(check: dict) -> bool:
    return check["status"] == "warn" and check["reason"] == "limit"


def test_a_low_open_file_limit_is_not_checked_never_a_missing_shebang_nor_a_vanished_directory(short_dir):
    """Under each limit from 6 to 16 descriptors: a drop-in passes, or its own shell fails under the
    limit too, or it is "not checked" naming RLIMIT_NOFILE; never "give it a #! line" (EMFILE read
    as ENOEXEC), and a directory that cannot be opened is said, not taken as empty."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("needs prlimit (util-linux)")
    checks = drop_ins(short_dir, 3)
    seen: set[str] = set()
    for n in range(6, 17):
        _, found = run([prlimit, f"--nofile={n}"], checks, short_dir / "state")
        results = {key.split(":")[0]: value[0] for key, value in found.items()}
        for name, check in results.items():
            said = check.get("output") or check.get("message", "")
            assert "#!" not in said and check["reason"] != "cannot-start", (n, name, check)
            if limited(check):
                assert f"too many open files (RLIMIT_NOFILE={n})" in said, (n, check)
                seen.add("directory" if name == "drop-ins" else "check")
        assert "drop-ins" in results or {f"c{i}" for i in range(3)} <= set(results), (n, results)
    assert seen == {"directory", "check"}, seen


def nobody_can_run_the_suite(prefix: list[str]) -> None:
    probe = subprocess.run([*prefix, sys.executable, "-I", "-c", "import probes"], cwd=ROOT, capture_output=True,
                           check=False)
    if probe.returncode != 0:
        pytest.skip(f"uid {UID} cannot run {os.path.realpath(sys.executable)} or read the tree "
                    "(a parent directory is private)")


def as_another_user(nproc: int) -> list[str]:
    setpriv, prlimit = shutil.which("setpriv"), shutil.which("prlimit")
    if os.geteuid() != 0 or setpriv is None or prlimit is None:
        pytest.skip("needs root, setpriv and prlimit (util-linux): RLIMIT_NPROC does not bind root")
    return [prlimit, f"--nproc={nproc}", setpriv, f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--"]


def test_a_low_process_limit_is_not_checked_never_a_deadline_or_a_traceback(short_dir):
    """Threads count against RLIMIT_NPROC: a probe whose thread cannot start was 'no answer before the
    run's deadline' after 0.000 s, with a traceback per thread on stderr."""
    nobody_can_run_the_suite(as_another_user(64))
    checks = drop_ins(short_dir, 6)
    state = short_dir / "state"
    state.mkdir(mode=0o700)
    os.chown(state, UID, UID)
    warned = 0
    for n in (2, 4, 8, 16):
        out, found = run(as_another_user(n), checks, state)
        for key, (check,) in found.items():
            said = check.get("output") or check.get("message", "")
            assert check["reason"] not in ("deadline", "cannot-start", "internal-error"), (n, key, check)
            assert check["status"] == "pass" or limited(check), (n, key, check)
            if limited(check):
                warned += 1
                assert f"(RLIMIT_NPROC={n}, or the container's pids limit)" in said, (n, check)
        assert out.returncode == 0, out.stdout
    assert warned, "no limit was met: the test proves nothing"


CHILD = """
import json, os, resource, sys, time
from probes import proc
if sys.argv[1] == "nofile":
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 2, used + 2))  # room for one pipe, not a child
done = proc.run(["/bin/true"], deadline=time.monotonic() + 10)
print(json.dumps(done.spawn_error))
"""


@pytest.mark.parametrize("limit", ["nofile", "nproc"])
def test_a_child_that_a_limit_keeps_from_starting_is_named_as_that_limit(limit):
    """proc.run's spawn error under a real limit: EMFILE from pipe(), EAGAIN from fork()."""
    prefix = as_another_user(1) if limit == "nproc" else []  # 1: the interpreter itself, no child
    if prefix:
        nobody_can_run_the_suite(as_another_user(64))
    out = subprocess.run([*prefix, sys.executable, "-c", CHILD, limit], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout)
    words = {"nofile": "could not start: too many open files (RLIMIT_NOFILE=",
             "nproc": "could not start: process limit reached (RLIMIT_NPROC=1, or the container's pids limit)"}
    assert said.startswith(words[limit]), said


PROBES = """
import json, sys, time
from probes.config import Config
from probes.context import Context
from probes.framework import nccl, torch_cuda
from probes.hardware import nvidia_smi
from probes.state import State

cfg = Config()._replace(torch_device="cpu", torch_python=sys.executable)
out = {}
for module, device in ((nvidia_smi, "cpu"), (torch_cuda, "cpu"), (nccl, "cuda")):
    ctx = Context(cfg._replace(torch_device=device, nccl_min_shm_mib=0), time.monotonic() + 20, {},
                  State.open(sys.argv[1]))
    r = module.judge(module.gather(ctx), ctx)
    out[module.SPEC.name] = [r.status.value, r.reason, r.message]
print(json.dumps(out))
"""


def test_a_tool_or_worker_that_the_process_limit_keeps_from_starting_is_not_blamed(short_dir):
    """nvidia-smi was 'check the file mounted by the NVIDIA Container Toolkit', the torch worker
    'set HEALTHCHECK_TORCH_PYTHON to an executable Python': fork() said EAGAIN, and neither is at fault."""
    prefix = as_another_user(1)  # 1: the interpreter itself, so fork() says EAGAIN
    nobody_can_run_the_suite(as_another_user(64))
    state = short_dir / "state"
    state.mkdir(mode=0o700)
    os.chown(state, UID, UID)
    out = subprocess.run([*prefix, sys.executable, "-c", PROBES, str(state)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=False, env=clean_env(PATH="/usr/bin:/bin"))
    assert out.returncode == 0, out.stderr
    for name, (status, reason, message) in json.loads(out.stdout).items():
        assert (status, reason) == ("warn", "limit"), (name, message)
        assert "could not start: process limit reached (RLIMIT_NPROC=1" in message, (name, message)
