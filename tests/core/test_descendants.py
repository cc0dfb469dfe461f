"""Nothing outlives a probe: descendants that leave the child's session or group.

A grandchild that calls setsid(), a double-forking daemon, a fork storm of 100
processes and a SIGTERM handler that forks, each started by a real child, then the
child answers and exits or hangs past its deadline. proc.run must end them all and
return by its deadline + 0.5 s; so must the whole CLI with a stub nvidia-smi.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from probes import orphans, proc
from tests.conftest import ROOT, clean_env, run_cli
from tests.descendants import KINDS, hang, stub
from tests.servers import leftovers, wait_gone
from tests.stress.conftest import SMI

pytestmark = pytest.mark.loaded  # under load too: make loaded (Makefile)

SLACK = 0.5  # a call returns by its deadline + 0.5 s
ANSWER = SMI["ok"]  # a valid nvidia-smi answer, then exit 0
PR_GET_CHILD_SUBREAPER = 37


@pytest.fixture
def marker() -> str:
    return f"hc-desc-{uuid.uuid4().hex[:12]}"


def _run(path: Path, budget: float) -> tuple[proc.Completed, float]:
    start = time.monotonic()
    res = proc.run([str(path)], deadline=start + budget)
    return res, time.monotonic() - start


def _gone(marker: str) -> list[str]:
    """Leftovers after a moment's grace; killed here so one failure does not pile up."""
    left = wait_gone(marker)
    for p in left:
        p.kill()
    return [" ".join(p.info["cmdline"] or []) for p in left]


@pytest.mark.parametrize("kind", KINDS)
def test_descendants_of_a_child_that_answers_and_exits_are_ended(kind, marker, tmp_path):
    res, took = _run(stub(tmp_path / "tool", kind, marker, ANSWER), 10)
    assert res.returncode == 0 and not res.timed_out and b"NVIDIA H100" in res.stdout
    assert took < 2.0, f"took {took:.2f}s"
    assert _gone(marker) == []


@pytest.mark.parametrize("kind", KINDS)
def test_descendants_of_a_child_that_hangs_are_ended_by_the_deadline(kind, marker, tmp_path):
    res, took = _run(stub(tmp_path / "tool", kind, marker, hang(marker)), 0.5)
    assert res.timed_out and not res.stuck
    assert took <= 0.5 + SLACK, f"took {took:.2f}s"
    assert _gone(marker) == []


def test_a_sigterm_handler_that_forks_is_ended_too(marker, tmp_path):
    path = stub(tmp_path / "tool", "term-fork", marker)
    start = time.monotonic()
    res = proc.run([str(path)], deadline=start + 5, until=lambda out: b"ready" in out, linger=0.3)
    took = time.monotonic() - start
    assert res.timed_out and res.lingered and took <= 0.3 + SLACK + 1.0  # + the interpreter's start
    assert _gone(marker) == []


def test_a_whole_storm_is_found(marker, tmp_path):
    """All STORM_SIZE processes exist before the deadline; none survives it."""
    # wait: until the storm's parent has forked all of them and exited (they are orphans).
    path = stub(tmp_path / "tool", "storm", marker, f"wait\n{hang(marker)}")
    res, took = _run(path, 3.0)
    assert res.timed_out and took <= 3.0 + SLACK
    assert _gone(marker) == []


# An orphan of ours that never stops forking (a marked sleeper every 5 ms); it writes its pid.
FORKER = ("import os, sys, time\nif os.fork(): os._exit(0)\nos.setsid()\n"
          "open(sys.argv[2], 'w').write(str(os.getpid()))\nwhile True:\n"
          "    if os.fork() == 0:\n        time.sleep(300)\n        os._exit(0)\n    time.sleep(0.005)")


def test_an_orphan_that_never_stops_forking_is_ended_with_all_it_forked(marker, tmp_path):
    """A storm outside the child's group that goes on while it is ended: each pass kills what it
    finds, a killed process forks no more, and the next pass finds what was forked before."""
    ready = tmp_path / "forker"
    tool = tmp_path / "tool"
    tool.write_text(f"#!/bin/bash\n{sys.executable} -I -S -c \"{FORKER}\" '{marker}-storm' {ready} &\n"
                    f"while [ ! -s {ready} ]; do sleep 0.01; done\n")
    tool.chmod(0o755)
    child = proc.spawn([str(tool)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert child.wait(10) == 0
    forker = psutil.Process(int(ready.read_text()))
    end = time.monotonic() + 5
    while len(forker.children()) < 3:
        assert time.monotonic() < end, "the forker did not fork"
        time.sleep(0.01)
    start = time.monotonic()
    proc.end(child, grace=0)
    assert time.monotonic() - start <= SLACK
    assert _gone(marker) == []


def test_sweeps_never_take_the_exit_status_of_someone_elses_child(marker, tmp_path):
    """A Popen child of other code that has exited (a zombie waiting for its owner) keeps
    its status through sweeps: they reap only specific pids they killed."""
    other = subprocess.Popen(["sh", "-c", "exit 7"])
    time.sleep(0.2)
    for kind in KINDS:
        _run(stub(tmp_path / f"tool-{kind}", kind, marker, ANSWER), 10)
    assert other.wait(5) == 7
    assert _gone(marker) == []


def _zombie_children() -> set[int]:
    found = set()
    for c in psutil.Process().children():
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                found.add(c.pid)
        except psutil.Error:
            continue
    return found


def test_what_runs_end_is_reaped_not_left_as_zombies(marker, tmp_path):
    """Orphans re-parented to us, killed or dead by themselves (a daemon's middle process,
    a storm's parent), are reaped: a long-lived process (serve) must not pile up zombies."""
    before = _zombie_children()
    for kind in KINDS:
        _run(stub(tmp_path / f"exit-{kind}", kind, marker, ANSWER), 10)
        _run(stub(tmp_path / f"hang-{kind}", kind, marker, hang(marker)), 0.5)
    _run(stub(tmp_path / "term-fork", "term-fork", marker), 0.5)
    assert _gone(marker) == []
    assert _zombie_children() - before == set()


def test_this_process_is_the_subreaper_and_children_carry_a_run_marker(monkeypatch):
    monkeypatch.setenv(orphans.RUN_ID_VAR, "outer-1-abc")
    res = proc.run(["sh", "-c", f'echo "${orphans.RUN_ID_VAR}"'], deadline=time.monotonic() + 5)
    outer, _, mine = res.stdout.decode().strip().partition(":")
    assert outer == "outer-1-abc" and mine.startswith(f"{os.getpid()}-")
    flag = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    assert flag.value == 1


FINAL_SWEEP = """
import os, sys, time
import psutil
from probes import proc
from tests.servers import leftovers
marker, tool = sys.argv[1], sys.argv[2]
res = proc.run([tool], deadline=time.monotonic() + 10)
time.sleep(0.3)
before = [p for p in leftovers(marker) if p.pid != os.getpid()]
# A later run looks at the stranger (an empty environment), lets it go on, and is not slowed.
t = time.monotonic()
later = proc.run(["true"], deadline=time.monotonic() + 10)
later_took = time.monotonic() - t
running = all(p.status() != psutil.STATUS_STOPPED for p in before)
ended = proc.end_descendants(grace=0.2)
print([p.info["cmdline"] for p in before], later_took, file=sys.stderr)
print(res.returncode, len(before), ended, int(later.returncode == 0 and running), later_took)
"""


def test_end_descendants_is_the_final_sweep(marker, tmp_path):
    """A daemon that drops the run marker from its environment (env -i) after a double
    fork escapes the run's sweep (and later runs' sweeps leave it running: it is not
    theirs); the final sweep of the exiting process ends it."""
    # The daemon's environment is empty: nothing tells it apart.
    daemon = ('import os, sys\nif os.fork(): os._exit(0)\nos.setsid()\nif os.fork(): os._exit(0)\n'
              'os.execve("/bin/sleep", [sys.argv[1], "300"], {})')
    hidden = f"{sys.executable} -I -S -c '{daemon}' '{marker}-hidden' &\nsleep 0.2\nexit 0"
    tool = stub(tmp_path / "tool", "setsid", marker, hidden)
    r = subprocess.run([sys.executable, "-c", FINAL_SWEEP, marker, str(tool)], cwd=ROOT, env=clean_env(),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    rc, before, ended, later_ok, later_took = r.stdout.split()
    assert (rc, before, later_ok) == ("0", "1", "1"), r.stdout + r.stderr
    assert int(ended) >= 1 and float(later_took) < 0.1, r.stdout + r.stderr
    assert _gone(marker) == []


# A process of another user with an empty environment (a training job, say) that says so each time
# it is continued (SIGSTOP cannot be caught, the SIGCONT that must follow it can).
STRANGER = "trap 'echo continued' CONT; echo ready $$; while :; do sleep 0.1; done"

REFUSED = """
import ctypes, json, os, subprocess, sys, threading, time
from probes import proc
real_cdll = ctypes.CDLL

def refusing(*args, **kwargs):  # libc, whose prctl says no to the child subreaper (as before Linux 3.4)
    libc = real_cdll(*args, **kwargs)
    prctl = libc.prctl
    libc.prctl = lambda option, *rest: -1 if option == 36 else prctl(option, *rest)
    return libc

ctypes.CDLL = refusing
assert not proc.subreaper()
stranger = sys.argv[1]
r, w = os.pipe()

def start() -> None:  # once the run's child is there: a process started since the run began
    time.sleep(0.3)
    subprocess.run(["setsid", "-f", "env", "-i", "/bin/sh", "-c", stranger], stdout=w,
                   stderr=subprocess.DEVNULL, user=4242, group=4242, extra_groups=[], check=True)

t = threading.Thread(target=start)
t.start()
done = proc.run(["sleep", "30"], deadline=time.monotonic() + 2.0)
t.join()
time.sleep(0.3)
os.close(w)
os.set_blocking(r, False)
said = os.read(r, 4096).decode().split()
pid = int(said[1])
state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
os.killpg(pid, 9)
print(json.dumps({"timed_out": done.timed_out, "said": said, "state": state}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may start a process as another user")
def test_without_the_subreaper_no_process_of_another_user_is_stopped_or_continued():
    """Where the kernel refuses the child subreaper, only the run's descendants are looked at: a
    process of another uid with an empty environment, started during the run and there while its
    child is ended, is never stopped and never continued."""
    r = subprocess.run([sys.executable, "-c", REFUSED, STRANGER], cwd=ROOT, env=clean_env(),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["timed_out"] and got["said"][0] == "ready", got
    assert "continued" not in got["said"] and got["state"] in ("S", "R"), got


def test_end_descendants_with_nothing_started_is_free():
    code = ("import time; from probes import proc; t = time.perf_counter(); n = proc.end_descendants(); "
            "print(n, time.perf_counter() - t)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True,
                       text=True, timeout=60, check=True)
    n, took = r.stdout.split()
    assert n == "0" and float(took) < 0.001


SWEEP_FREE = """
import os, sys, time
reads = []  # each read of the process table lists /proc
listdir = os.listdir
os.listdir = lambda path=".": (reads.append(1) if path == "/proc" else None) or listdir(path)
from probes import proc
proc.run([sys.argv[1]], deadline=time.monotonic() + 30)  # the first child: the one look for a killed suite's
reads.clear()                                           # leftovers (probes/orphans.py), once per process
r = proc.run([sys.argv[1]], deadline=time.monotonic() + 30)
at_end = len(reads)
n = proc.end_descendants()
print(r.returncode, at_end, len(reads), n)
"""


def test_a_child_that_exited_leaving_nothing_costs_no_sweep(tmp_path):
    """The common run: nvidia-smi answers and exits, and nothing of it is left. The subreaper
    then has no child at all, so neither the child's end nor the final sweep reads the process
    table (each read is a stat of every process: milliseconds a run on a busy host)."""
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho ok\n")
    tool.chmod(0o755)
    r = subprocess.run([sys.executable, "-c", SWEEP_FREE, str(tool)], cwd=ROOT, env=clean_env(),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.stdout.split() == ["0", "0", "0", "0"], r.stdout + r.stderr


def test_spawn_and_end_one_long_lived_child(marker, tmp_path):
    """serve's NVML watcher is such a child: spawned, read in a thread, ended on shutdown."""
    tool = stub(tmp_path / "tool", "double-fork", marker, hang(marker))
    child = proc.spawn([str(tool)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    assert len(leftovers(marker)) == 2
    start = time.monotonic()
    assert proc.end(child, grace=0.2) == -15
    assert time.monotonic() - start <= 0.2 + SLACK
    assert _gone(marker) == []
    assert proc.end(child) == -15  # twice is harmless


# ------------------------------------------------------------------ the whole CLI

@pytest.mark.parametrize(("kind", "then", "front_door"), [
    ("setsid", "answer", True),
    ("double-fork", "answer", False),
    ("storm", "answer", True),
    ("setsid", "hang", False),
    ("double-fork", "hang", True),
    ("storm", "hang", False),
    ("term-fork", "hang", True),
])
def test_cli_with_a_stub_nvidia_smi_leaves_nothing(kind, then, front_door, marker, tmp_path):
    bindir = tmp_path / "bin"
    stub(bindir / "nvidia-smi", kind, marker, ANSWER if then == "answer" else hang(marker))
    timeout = 2.0
    env = clean_env(PATH=f"{bindir}:/usr/bin:/bin", HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                    HEALTHCHECK_TIMEOUT=str(timeout), HEALTHCHECK_GPU_COUNT="1")
    start = time.monotonic()
    r = run_cli("--only", "nvidia-smi", env=env, front_door=front_door, timeout=60)
    took = time.monotonic() - start
    assert r.returncode == (0 if then == "answer" else 1), r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert took <= timeout + SLACK + 1.0  # + the interpreter's start on a loaded machine
    assert _gone(marker) == []


def test_the_cli_ends_even_what_no_run_marker_matches_when_it_exits(marker, tmp_path):
    """A daemon that drops its environment (env -i) cannot be matched to its run; the CLI's
    final sweep ends it before the process exits."""
    from tests.stress.conftest import write_exe

    bindir = tmp_path / "bin"
    write_exe(bindir / "nvidia-smi", f"env -i setsid bash -c 'exec -a \"$0\" sleep 300' '{marker}-envless' &\n"
                                     f"{ANSWER}")
    env = clean_env(PATH=f"{bindir}:/usr/bin:/bin", HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                    HEALTHCHECK_GPU_COUNT="1")
    r = run_cli("--only", "nvidia-smi", env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _gone(marker) == []


def test_sigterm_mid_run_ends_what_the_run_started_and_answers_unhealthy(marker, tmp_path):
    """The front door's hard stop and `docker stop` send SIGTERM to the suite itself."""
    bindir = tmp_path / "bin"
    stub(bindir / "nvidia-smi", "setsid", marker, hang(marker))
    env = clean_env(PATH=f"{bindir}:/usr/bin:/bin", HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                    HEALTHCHECK_GPU_COUNT="1", HEALTHCHECK_TIMEOUT="60")
    p = subprocess.Popen([sys.executable, "-m", "probes", "--only", "nvidia-smi"], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    end = time.monotonic() + 20
    while not leftovers(f"{marker}-hang") and time.monotonic() < end:
        time.sleep(0.05)
    assert leftovers(f"{marker}-hang"), "the stub never started"
    p.terminate()
    out, err = p.communicate(timeout=20)
    assert p.returncode == 1 and b"Traceback" not in out + err
    assert _gone(marker) == []
