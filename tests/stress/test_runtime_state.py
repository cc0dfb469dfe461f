"""The state dir as container runtimes leave it: a read-only /tmp, an arbitrary UID with no passwd
entry (OpenShift: any UID, GID 0), a hostile umask, a full disk, /proc mounted hidepid=2.

Whole processes through the front door in a private mount namespace (``unshare -m``) with real
mounts (read-only binds, tmpfs), dropped to uid 12345 with ``setpriv``; the torch worker is the
real torch on the CPU or the fake torch package of tests/framework for a fatal CUDA error.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, clean_env
from tests.framework.conftest import FAKE_TORCH
from tests.stress.conftest import VENV_PY, write_exe
from tests.stress.test_state import tmpfs

pytestmark = pytest.mark.stress

UID = 12345  # no passwd entry: as OpenShift runs a pod


def _needs_root() -> None:
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")):
        pytest.skip("needs root, unshare, setpriv and mount (util-linux) for real mounts and another uid")


def _reach_interpreter() -> str:
    """Shell lines that make the suite's interpreter reachable by another uid inside the namespace:
    a private /root (pyenv's default home) hides it; a tmpfs over /root with the interpreter's tree
    moved back in opens the way without touching the machine."""
    real = os.path.realpath(VENV_PY)
    if not real.startswith("/root/"):
        return ""
    top = "/root/" + real.split("/")[2]
    return (f'mount --bind {top} "$SAVE" && mount -t tmpfs -o mode=0755 none /root && mkdir {top} '
            f'&& mount --move "$SAVE" {top}')


def as_uid(setup: str, argv: list[str], env: dict[str, str], *, cwd: str = "/", umask: str = "0022",
           uid: int = UID, gid: int = 0, pid_ns: bool = False,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``argv`` as ``uid``:``gid`` (no supplementary groups) in a new mount namespace after ``setup``
    (shell); with ``pid_ns`` in a new pid namespace too, with its own /proc."""
    save = tempfile.mkdtemp(prefix="hc-save-")
    # In a new pid namespace the shell stays PID 1 (root), as a container's init would.
    script = (f"set -e\nmount --make-rprivate /\n{_reach_interpreter()}\n{setup}\ncd {cwd}\numask {umask}\n"
              f'{"" if pid_ns else "exec "}setpriv --reuid {uid} --regid {gid} --clear-groups -- "$@"'
              f'{" && exit 0" if pid_ns else ""}')
    unshare = ["unshare", "-pfm", "--mount-proc"] if pid_ns else ["unshare", "-m"]
    try:
        return subprocess.run([*unshare, "sh", "-c", script, "sh", *argv], env={**env, "SAVE": save},
                              capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        os.rmdir(save)


@pytest.fixture
def box() -> Iterator[Path]:
    """A mode-0755 directory outside pytest's private temporary tree: uid 12345 can reach it."""
    d = Path(tempfile.mkdtemp(prefix="hcstress-rt-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def torch_env(box: Path, **extra: str) -> dict[str, str]:
    """Only torch-cuda, on the CPU, through a python that counts its starts into box/starts."""
    count = box / "starts"
    count.touch()
    count.chmod(0o666)
    torch_py = write_exe(box / "python-counting", f'echo $$ >> {count}\nexec {VENV_PY} "$@"')
    env = clean_env(HEALTHCHECK_PYTHON=VENV_PY, HEALTHCHECK_TORCH_PYTHON=str(torch_py),
                    HEALTHCHECK_TORCH_DEVICE="cpu", HEALTHCHECK_TORCH_TTL="3600",
                    ENABLE_GPU_CHECK="false", ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false",
                    HOME=str(box / "home"), PATH="/usr/bin:/bin")
    env.pop("HEALTHCHECK_STATE_DIR", None)
    env.pop("TMPDIR", None)
    env.pop("XDG_RUNTIME_DIR", None)
    env.update(extra)
    return env


def starts(box: Path) -> int:
    return len((box / "starts").read_text().split())


def read_only_tmp(box: Path, *, shm_writable: bool) -> str:
    """/tmp bound read-only over itself, /dev/shm a fresh directory (writable or not), and
    box/cwd a writable working directory owned by the uid: where the state dir must never go."""
    (box / "shm").mkdir(mode=0o755)
    (box / "shm").chmod(0o1777 if shm_writable else 0o755)
    for d in ("cwd", "home"):
        (box / d).mkdir(mode=0o755)
        os.chown(box / d, UID, 0)
    return (f'mount --bind {box}/shm /dev/shm\nmount --bind /tmp /tmp && mount -o remount,bind,ro /tmp\n'
            f'mount --bind /run /run && mount -o remount,bind,ro /run\n'
            f'mount --bind {box} {box} && mount -o remount,bind,rw {box}')


def healthcheck(*args: str) -> list[str]:
    return [str(ROOT / "healthcheck"), *args]


def test_read_only_tmp_as_an_arbitrary_uid_keeps_the_state_in_dev_shm(box: Path) -> None:
    """readOnlyRootFilesystem without an emptyDir on /tmp, uid 12345: every profile answers, the
    state dir is /dev/shm/healthcheck-12345 (0700, ours), and readiness reuses its cached run."""
    _needs_root()
    env = torch_env(box)
    setup = read_only_tmp(box, shm_writable=True)
    for profile in ("readiness", "readiness", "liveness"):
        res = as_uid(setup, healthcheck("--profile", profile), env, cwd=str(box / "cwd"))
        assert res.returncode == 0 and res.stdout.startswith("healthy"), (profile, res.stdout, res.stderr)
        assert "PASS torch-cuda" in res.stdout and "internal error" not in res.stdout + res.stderr
        assert "caching off" not in res.stdout, res.stdout
    state = box / "shm" / f"healthcheck-{UID}"
    st = os.lstat(state)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (UID, 0o700)
    assert starts(box) == 1, "the second readiness run did not reuse the cached pass"
    assert os.listdir(box / "cwd") == [], "the state dir landed in the working directory"


def test_nothing_writable_turns_caching_off_and_says_so(box: Path) -> None:
    """/tmp, /run and /dev/shm read-only: caching off with the reason, never an internal error,
    never the working directory (writable or not); liveness passes (no restart loop)."""
    _needs_root()
    env = torch_env(box)
    setup = read_only_tmp(box, shm_writable=False)
    for cwd in (str(box / "cwd"), "/"):
        for profile in ("liveness", "readiness"):
            res = as_uid(setup, healthcheck("--profile", profile), env, cwd=cwd)
            out = res.stdout
            assert res.returncode == 0 and out.startswith("healthy"), (cwd, profile, out, res.stderr)
            assert "internal error" not in out + res.stderr and "Traceback" not in res.stderr
            assert "caching off: no writable state dir" in out and f"/dev/shm/healthcheck-{UID}" in out, out
        assert os.listdir(box / "cwd") == [], "the state dir landed in the working directory"
    assert starts(box) == 2  # every readiness run starts its own worker without a cache


def test_umask_0477_as_a_non_root_user_leaves_later_runs_working(box: Path) -> None:
    """The first run's umask must not leave a state dir or lock only it could have used: a
    second run neither waits for a lock that nobody holds nor misses the cache."""
    _needs_root()
    env = torch_env(box)
    setup = read_only_tmp(box, shm_writable=True)
    for umask in ("0477", "0022"):
        res = as_uid(setup, healthcheck("--profile", "readiness"), env, umask=umask)
        assert res.returncode == 0 and "PASS torch-cuda" in res.stdout, (umask, res.stdout, res.stderr)
        assert "holds the lock" not in res.stdout
    state = box / "shm" / f"healthcheck-{UID}"
    assert stat.S_IMODE(os.lstat(state).st_mode) == 0o700
    assert {stat.S_IMODE(os.lstat(state / n).st_mode) for n in os.listdir(state)} == {0o600}
    assert starts(box) == 1


# ------------------------------------------------------------------------- a full state dir

def fatal_env(box: Path, state: Path) -> dict[str, str]:
    """torch-cuda through the fake torch package's sticky CUDA error; the log beside, not on the full disk."""
    interp = write_exe(box / "python-fatal", f"export PYTHONPATH={FAKE_TORCH} FAKE_TORCH_MODE=fatal\n"
                                              f'exec {VENV_PY} "$@"')
    return clean_env(HEALTHCHECK_PYTHON=VENV_PY, HEALTHCHECK_TORCH_PYTHON=str(interp),
                     ENABLE_GPU_CHECK="false", ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false",
                     HEALTHCHECK_STATE_DIR=str(state), HEALTHCHECK_LOG_FILE=str(box / "run.log"))


def fill(mnt: Path, *, inodes: bool) -> None:
    """Fill the tmpfs: every data block (dd until ENOSPC), and with ``inodes`` every inode too."""
    subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/filler", "bs=4k"], capture_output=True, check=False)
    if inodes:
        with contextlib.suppress(OSError):
            for i in range(100_000):
                os.close(os.open(mnt / f"i{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    with pytest.raises(OSError):
        (mnt / "probe-write").write_bytes(b"x" * 4096)


def run(env: dict[str, str], profile: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(healthcheck("--profile", profile), env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_full_state_dir_still_keeps_the_latch_as_an_empty_file(box: Path) -> None:
    _needs_root()
    mnt = box / "full"
    with tmpfs(mnt, "size=64k,mode=0755"):
        state = mnt / "st"
        env = fatal_env(box, state)
        assert run(env, "liveness").returncode == 0  # makes the state dir while there is room
        fill(mnt, inodes=False)
        first = run(env, "readiness")
        assert first.returncode == 1 and "FAIL torch-cuda" in first.stdout, first.stdout
        assert "unhealthy until the container restarts" in first.stdout, first.stdout
        assert [n for n in os.listdir(state) if n.startswith("latch@")], os.listdir(state)
        for profile in ("liveness", "readiness", "startup"):
            res = run(env, profile)
            assert res.returncode == 1, (profile, res.stdout)
            assert "latched unhealthy" in res.stdout and "details could not be stored" in res.stdout, res.stdout


def test_a_latch_that_cannot_be_kept_is_said_in_the_output_and_the_log(box: Path) -> None:
    _needs_root()
    mnt = box / "full"
    with tmpfs(mnt, "size=64k,nr_inodes=64,mode=0755"):
        state = mnt / "st"
        env = fatal_env(box, state)
        assert run(env, "liveness").returncode == 0
        fill(mnt, inodes=True)
        first = run(env, "readiness")
        assert first.returncode == 1 and "FAIL torch-cuda" in first.stdout, first.stdout
        assert "the latch could not be kept" in first.stdout, first.stdout
        assert "unhealthy until the container restarts" not in first.stdout, first.stdout
        log = (box / "run.log").read_text()
        assert "NOT latched" in log and "restart the container" in log, log
        # Nothing was kept, and nothing claims otherwise: the next liveness run sees no latch.
        assert run(env, "liveness").returncode == 0


# ------------------------------------------------------------------------- names taken first

SQUATTER = 4242


@pytest.mark.parametrize("uid", [0, UID])
def test_state_names_another_user_took_first_still_keep_the_latch(box: Path, uid: int) -> None:
    """Another uid made /tmp/healthcheck-<uid> and /dev/shm/healthcheck-<uid> before the first run,
    and /run is read-only: the suite still gets a private state dir (beside the taken name) and a
    CUDA-fatal latch holds on the next liveness runs. /tmp and /dev/shm are fresh tmpfs mounts of
    one private namespace for the whole sequence; the box is bound back at its path in the new /tmp."""
    _needs_root()
    env = fatal_env(box, box / "unused")
    for var in ("HEALTHCHECK_STATE_DIR", "HEALTHCHECK_LOG_FILE", "TMPDIR", "XDG_RUNTIME_DIR"):
        env.pop(var, None)
    new_tmp = box / "new-tmp"
    new_tmp.mkdir()
    inside = f"{new_tmp}/{os.path.relpath(box, '/tmp')}"  # where the box shows in the new /tmp
    back = "" if ".." in inside else f"mkdir -p {inside}\nmount --bind {box} {inside}\n"
    names = f"/tmp/healthcheck-{uid} /dev/shm/healthcheck-{uid}"
    setup = (f"mount -t tmpfs -o mode=1777 hc-tmp {new_tmp}\n{back}mount --move {new_tmp} /tmp\n"
             "mount -t tmpfs -o mode=1777 hc-shm /dev/shm\nmount -t tmpfs -o ro,mode=0755 hc-run /run\n"
             f"setpriv --reuid {SQUATTER} --regid {SQUATTER} --clear-groups mkdir -m 0700 {names}")
    door = " ".join(healthcheck())
    runs = (f"for p in readiness liveness liveness; do {door} --profile $p; echo \"== exit $?\"; done\n"
            "ls -lnd /tmp/healthcheck-* /dev/shm/healthcheck-*")
    res = as_uid(setup, ["sh", "-c", runs], env, uid=uid)
    out = res.stdout
    assert res.returncode == 0, (out, res.stderr)
    (first, code), *later = re.findall(r"(.*?)== exit (\d+)\n", out, re.S)
    assert code == "1" and "FAIL torch-cuda" in first and "unhealthy until the container restarts" in first, out
    assert len(later) == 2 and all(c == "1" and "latched unhealthy" in run for run, c in later), out
    listed = {line.split()[-1]: (line.split()[0], int(line.split()[2])) for line in out.splitlines()
              if line.startswith("d")}
    assert listed.pop(f"/tmp/healthcheck-{uid}") == ("drwx------", SQUATTER), out
    assert listed.pop(f"/dev/shm/healthcheck-{uid}") == ("drwx------", SQUATTER), out
    [(name, found)] = listed.items()
    assert name.startswith(f"/tmp/healthcheck-{uid}.") and found == ("drwx------", uid), out


# ------------------------------------------------------------------------- hidepid=2

def test_the_latch_follows_the_container_life_when_pid1_is_hidden(box: Path) -> None:
    """/proc mounted hidepid=2 and a non-root uid: PID 1 cannot be seen. A latch root set in one
    life holds for the uid's runs in that life and is cleared in the next one (a new pid namespace
    and /proc, as a restarted container gets), where the identity used to be ``<boot>:?`` in both."""
    _needs_root()
    state = box / "state"
    state.mkdir(mode=0o700)
    tool = box / "latch.py"
    tool.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom probes.state import State, life\n"
                    "s = State.open(sys.argv[2])\nif sys.argv[1] == 'set':\n"
                    "    assert s.set_latch('torch-cuda', 'fatal', 'cuda-fatal'), s.problem\n"
                    "print(life().ident, life().pid1, s.latch() is not None, s.disabled_reason is None)\n")
    tool.chmod(0o644)
    env = clean_env(PATH="/usr/bin:/bin")
    # hidepid exempts the group named by gid= (default 0): the uid runs with a group of its own.
    hide = "mount -o remount,hidepid=2 /proc"
    get = [VENV_PY, "-I", str(tool), "get", str(state)]
    # One life: root sets the latch (it sees PID 1), hands the dir over, the uid reads it behind hidepid=2.
    res = as_uid(f"{hide}\n{VENV_PY} -I {tool} set {state} > {box}/root.out\nchown -R {UID}:0 {state}",
                 get, env, gid=UID, pid_ns=True)
    assert res.returncode == 0, res.stderr
    root, seen = (box / "root.out").read_text().split(), res.stdout.split()
    assert root[1] != "None" and seen[1] == "None", (root, seen)  # PID 1: seen by root, hidden from the uid
    assert seen[0] == root[0] and seen[2:] == ["True", "True"], (root, seen)
    # The next life: the uid's run clears it.
    res = as_uid(hide, get, env, gid=UID, pid_ns=True)
    assert res.returncode == 0, res.stderr
    nxt = res.stdout.split()
    assert nxt[0] != seen[0] and nxt[2:] == ["False", "True"], (seen, nxt)
    assert os.listdir(state) == []
