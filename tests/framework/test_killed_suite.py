"""A suite killed by SIGKILL (the OOM killer, the front door's KILL after its TERM, a runtime
ending a timed-out exec) runs no handler and ends nothing itself: its torch worker dies with it
(the parent-death signal the worker arms), what else it left is ended by the next run (by the
run marker), and the next run never starts a second worker beside a live orphan.

Real processes and real signals: the suite is the real CLI (or the real front door), the worker
the real torch_worker.py on the fake torch, sleeping in its import as a hung one would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import PYTHON, ROOT, clean_env, run_cli
from tests.framework.conftest import FAKE_TORCH, REAL_PYTHON, Interp, write_exe

pytestmark = pytest.mark.loaded  # under load too: make loaded (Makefile)

WITHIN = 5.0  # seconds for what was killed to be gone (SIGKILL is asynchronous; a loaded machine)


def _until(ready: Callable[[], object], within: float) -> object:
    """Poll ``ready`` until it is truthy or ``within`` seconds pass; its last value."""
    end = time.monotonic() + within
    while not (value := ready()) and time.monotonic() < end:
        time.sleep(0.05)
    return value


def _env(tmp_path: Path, python: object, **extra: str) -> dict[str, str]:
    checks = tmp_path / "checks"
    checks.mkdir(exist_ok=True)
    return clean_env(HEALTHCHECK_TORCH_DEVICE="cpu", HEALTHCHECK_TORCH_PYTHON=str(python),
                     HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_CHECKS_DIR=str(checks),
                     HEALTHCHECK_TIMEOUT="30", **extra)


def _suite(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PYTHON, "-m", "probes", "--profile", "startup", *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _slow(make_interp: Callable[..., Interp], tmp_path: Path, name: str, **kw: str) -> tuple[Interp, Path]:
    """An interpreter whose torch worker sleeps in its import; the file it creates once there
    (after the phase markers it writes to the suite: a worker that writes to a dead suite's pipe
    dies of SIGPIPE by itself)."""
    ready = tmp_path / f"{name}.ready"
    return make_interp(name, mode="ok", exports={"FAKE_TORCH_SLEEP": "60", "FAKE_TORCH_READY": str(ready)},
                       **kw), ready


def _kill(suite: subprocess.Popen[bytes]) -> None:
    os.kill(suite.pid, signal.SIGKILL)
    suite.wait(10)


def _others(alive: Callable[[], list[int]], *besides: int) -> list[int]:
    return [pid for pid in alive() if pid not in besides]


@pytest.fixture
def tagged(marker: Callable[[], list[int]]):
    """The marker fixture's lister; whatever a test leaves is killed afterwards."""
    yield marker
    for pid in marker():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_worker_dies_with_a_suite_killed_by_sigkill(make_interp: Callable[..., Interp], tagged,
                                                         tmp_path: Path) -> None:
    py, ready = _slow(make_interp, tmp_path, "slow")
    suite = _suite(_env(tmp_path, py), "--only", "torch-cuda")
    assert _until(ready.exists, 20), "the torch worker did not start"
    _kill(suite)
    left = _until(lambda: not _others(tagged, suite.pid), WITHIN) or _others(tagged, suite.pid)
    assert left is True, f"the worker outlived the killed suite: {left}"


def test_the_front_doors_kill_after_its_term_leaves_no_worker(make_interp: Callable[..., Interp], tagged,
                                                             tmp_path: Path) -> None:
    """The front door TERMs the suite at its hard deadline and KILLs it a second later; here the
    suite cannot act on the TERM (blocked: a wedged interpreter) and its own deadline is later."""
    py, ready = _slow(make_interp, tmp_path, "slow")
    wedged = write_exe(tmp_path / "wedged-python", (
        "#!/bin/sh\n"
        "entry=$3\nshift 3\n"  # the front door runs: python -I -c ENTRY ARGS...
        "echo 4 >&3 && exec 3>&-\n"  # the hard deadline the front door hears: 4 s, not the suite's 33 s
        f'exec "{REAL_PYTHON}" -I -c "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, '
        '[signal.SIGTERM]); $entry" "$@"\n'))
    env = _env(tmp_path, py, HEALTHCHECK_PYTHON=str(wedged))
    r = subprocess.run([str(ROOT / "healthcheck"), "--profile", "startup", "--only", "torch-cuda"], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1 and "no verdict within 4s (hard deadline)" in r.stdout, r.stdout + r.stderr
    assert ready.exists(), "the torch worker did not start"
    left = _until(lambda: not tagged(), WITHIN) or tagged()
    assert left is True, f"the worker outlived the suite the front door killed: {left}"


def test_the_next_run_ends_an_orphan_worker_before_it_starts_one(make_interp: Callable[..., Interp],
                                                                 tagged, tmp_path: Path) -> None:
    """Two interpreter wrappers that do not exec keep the worker from the parent-death signal's
    reach: the outer one, the suite's child, dies with the suite, but the inner one, the worker's
    parent, lives on; the next run ends both before its own worker."""
    slow, ready = _slow(make_interp, tmp_path, "wrapped",
                        body=f'sh -c \'"$0" "$@"; exit $?\' "{REAL_PYTHON}" "$@"; exit $?')
    suite = _suite(_env(tmp_path, slow), "--only", "torch-cuda")
    assert _until(ready.exists, 20), "the torch worker did not start"
    _kill(suite)
    orphans = _others(tagged, suite.pid)
    assert len(orphans) >= 2, f"no orphan to test with: {orphans}"
    seen = tmp_path / "seen"
    # The next run's interpreter notes the orphans' state as it starts: none may still be running.
    pids = " ".join(map(str, orphans))
    quick = make_interp("quick", mode="ok", body=(
        f'for p in {pids}; do cat /proc/$p/stat >> "{seen}" 2>/dev/null; done; touch "{seen}"\n'
        f'exec "{REAL_PYTHON}" "$@"'))
    r = run_cli("--profile", "startup", "--only", "torch-cuda", "--json", env=_env(tmp_path, quick), timeout=60)
    assert quick.starts == 1, r.stdout + r.stderr
    running = [line for line in seen.read_text().splitlines() if line.rsplit(")", 1)[1].split()[0] not in "ZX"]
    assert running == [], "the next run started its worker beside the orphans"
    assert json.loads(r.stdout)["checks"]["torch-cuda:devices"][0]["status"] == "pass", r.stdout
    left = _until(lambda: not tagged(), WITHIN) or tagged()
    assert left is True, f"orphans left: {left}"


def test_the_next_run_ends_what_a_killed_suites_drop_in_left(tagged, tmp_path: Path) -> None:
    """What a drop-in started (a grandchild that called setsid, one left in the drop-in's session
    once the drop-in itself exited) outlives the SIGKILL of the suite (nothing gives it a
    parent-death signal); the next run that starts a child ends it."""
    env = _env(tmp_path, REAL_PYTHON, ENABLE_GPU_CHECK="false", ENABLE_TORCH_CHECK="false",
               ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false")
    flag, started, release = tmp_path / "hang", tmp_path / "started", tmp_path / "release"
    flag.touch()
    # The drop-in starts its two children, says so, and exits only once released: the suite is
    # killed while all three live, whatever the machine's load.
    write_exe(tmp_path / "checks" / "sleeper", (
        f'#!/bin/sh\nif [ -e "{flag}" ]; then setsid sleep 300 & sleep 300 & touch "{started}"\n'
        f'  while [ ! -e "{release}" ]; do sleep 0.05; done; exit 0; fi\necho "fine"\n'))
    suite = _suite(env, "--only", "sleeper")
    assert _until(lambda: started.exists() and len(_others(tagged, suite.pid)) >= 3, 20), "the drop-in did not start"
    _kill(suite)
    release.touch()
    orphans = _until(lambda: len(tagged()) == 2, 20) and tagged()  # the drop-in exited
    assert orphans and len(orphans) == 2, f"no orphans to test with: {tagged()}"
    flag.unlink()
    r = run_cli("--profile", "startup", "--only", "sleeper", env=env, timeout=60)
    assert r.returncode == 0 and "sleeper" in r.stdout, r.stdout + r.stderr
    left = _until(lambda: not tagged(), WITHIN) or tagged()
    assert left is True, f"what the killed suite's drop-in left still runs: {left}"


def test_a_drop_in_dies_with_its_suite_killed_by_sigkill(tagged, tmp_path: Path) -> None:
    """A drop-in that sleeps forever is gone within about a second after its suite is SIGKILLed,
    with no later run: every child the suite starts has the parent-death signal."""
    env = _env(tmp_path, REAL_PYTHON, ENABLE_GPU_CHECK="false", ENABLE_TORCH_CHECK="false",
               ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false")
    started = tmp_path / "started"
    write_exe(tmp_path / "checks" / "forever", f'#!/bin/sh\ntouch "{started}"\nexec sleep 300\n')
    suite = _suite(env, "--only", "forever")
    assert _until(lambda: started.exists() and _others(tagged, suite.pid), 20), "the drop-in did not start"
    _kill(suite)
    left = _until(lambda: not tagged(), 1.0) or tagged()
    assert left is True, f"the drop-in outlived the killed suite: {left}"


# In a PID namespace of its own (pid 1 there), so that the next fork can be given a chosen pid.
REUSE = """
import json, os, subprocess, time
from probes import orphans
from probes.pidstat import stat
# What a killed suite left: the marker of a suite process that is gone (no pid 999 here).
left = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"], "HEALTHCHECK_RUN_ID": "999-1-1-dead"},
                        start_new_session=True)
time.sleep(0.1)
found = orphans.find()
left.kill()  # it dies before the ending step
left.wait()
time.sleep(0.05)  # the next process starts at a later clock tick
with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
    fh.write(str(left.pid - 1))
job = subprocess.Popen(["sleep", "300"])  # an unrelated training job, on the leftover's pid
stuck = orphans.end(found)
time.sleep(0.1)
print(json.dumps({"found": {str(k): v for k, v in found.items()}, "left": left.pid, "job": job.pid,
                  "stuck": stuck, "running": job.poll() is None, "state": stat(job.pid).state.decode()}))
job.kill()
"""


def test_a_leftovers_pid_reused_before_it_is_ended_is_left_alone() -> None:
    """Between finding a killed suite's leftover and ending it, the leftover dies and its pid goes
    to another process: the ending step, given the old pid and start, never touches that one."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (util-linux) for a PID namespace of its own")
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", PYTHON, "-c", REUSE], cwd=ROOT,
                       env=clean_env(), capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert list(got["found"]) == [str(got["left"])] and got["job"] == got["left"], got
    assert got["running"] and got["state"] == "S" and got["stuck"] == [], got


def test_a_live_suites_worker_is_not_taken_for_a_leftover(make_interp: Callable[..., Interp], tagged,
                                                          tmp_path: Path) -> None:
    """Two suites at once: the second's sweep ends only what suites that are gone left."""
    py, ready = _slow(make_interp, tmp_path, "slow")
    first = _suite(_env(tmp_path, py), "--only", "torch-cuda")
    try:
        assert _until(ready.exists, 20), "the torch worker did not start"
        workers = _others(tagged, first.pid)
        assert workers
        write_exe(tmp_path / "checks" / "quick", '#!/bin/sh\necho "fine"\n')
        r = run_cli("--profile", "startup", "--only", "quick", env=_env(tmp_path, py), timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert first.poll() is None and set(workers) <= set(tagged()), "the live suite's worker was ended"
    finally:
        _kill(first)


@pytest.fixture
def frozen(tmp_path: Path):
    """A directory on a frozen filesystem (a loop-mounted ext4 image under ``fsfreeze -f``): a write
    there blocks in uninterruptible sleep, SIGKILL or not, as in a wedged driver, until thawed."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a loop device and freezes it")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with image.open("wb") as fh:
        fh.truncate(16 << 20)
    for argv in (["mkfs.ext4", "-q", str(image)], ["mount", "-o", "loop", str(image), str(mnt)]):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot make a frozen filesystem here: {' '.join(argv[:1])}: {done.stderr.strip()}")
    try:
        subprocess.run(["fsfreeze", "-f", str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["fsfreeze", "-u", str(mnt)], capture_output=True, check=False)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def test_a_leftover_that_survives_sigkill_holds_the_gpu_and_no_worker_starts(
        make_interp: Callable[..., Interp], tagged, frozen: Path, tmp_path: Path) -> None:
    """The killed suite's worker sits in uninterruptible sleep (a write to a frozen filesystem,
    as a wedged driver would hold it): the next run ends what it can, reports the survivor and
    starts no worker beside it."""
    stuck = make_interp("stuck", body=f'echo x > "{frozen}/f"')
    first = _suite(_env(tmp_path, stuck), "--only", "torch-cuda")
    found = _until(lambda: [p for p in _others(tagged, first.pid) if _state(p) == "D"], 20)
    assert found, "the worker did not block"
    _kill(first)
    quick = make_interp("quick", mode="ok")
    r = run_cli("--profile", "startup", "--only", "torch-cuda", "--json", env=_env(tmp_path, quick), timeout=60)
    assert quick.starts == 0, "a second worker started beside the one that survived SIGKILL"
    check = json.loads(r.stdout)["checks"]["torch-cuda:devices"][0]
    assert r.returncode == 1 and check["status"] == "fail" and f"pid {found[0]}" in check["output"], check
    subprocess.run(["fsfreeze", "-u", str(frozen)], check=True)  # the SIGKILL it got now ends it
    left = _until(lambda: not tagged(), WITHIN) or tagged()
    assert left is True, f"left: {left}"


def test_a_worker_whose_suite_is_gone_before_it_arms_exits_at_once(tmp_path: Path) -> None:
    """The race between the worker's start and the arming of its parent-death signal: a suite that
    is already gone (its marker names a pid with another start time: the killed suite's pid reused,
    or no process) gets no worker left running, and no answer."""
    worker = ROOT / "probes" / "framework" / "torch_worker.py"
    me = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
    pid1 = int(Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19])
    for marker in ("outer-1-abc:999999999-5-1-abcd", f"1-{pid1 + 1}-1-abcd"):
        env = {**clean_env(PYTHONPATH=str(FAKE_TORCH), FAKE_TORCH_MODE="ok"), "HEALTHCHECK_RUN_ID": marker}
        done = subprocess.run([REAL_PYTHON, str(worker), "--device", "cpu"], env=env, capture_output=True,
                              timeout=60, check=False)
        assert (done.returncode, done.stdout) == (1, b""), (marker, done)
    # The suite that started it is its parent: it runs.
    env = {**clean_env(PYTHONPATH=str(FAKE_TORCH), FAKE_TORCH_MODE="ok"),
           "HEALTHCHECK_RUN_ID": f"{os.getpid()}-{me}-1-abcd"}
    done = subprocess.run([REAL_PYTHON, str(worker), "--device", "cpu"], env=env, capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and done.stdout.startswith(b"HEALTHCHECK-TORCH-RESULT "), done
