"""The state directory: refused when unsafe, atomic files, locks with deadlines, the latch."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

from probes import state as state_mod
from probes.state import State


def test_created_private(tmp_path):
    s = State.open(str(tmp_path / "st"))
    assert s.enabled
    assert (os.stat(tmp_path / "st").st_mode & 0o777) == 0o700


def test_symlink_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", tmp_path / "st")
    s = State.open(str(tmp_path / "st"))
    assert not s.enabled and "symlink" in (s.disabled_reason or "")
    assert not s.write_json("x.json", {"a": 1})


def test_foreign_or_open_directory_is_refused(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    assert "owned by uid 65534" in (State.open(str(foreign)).disabled_reason or "")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert "writable by group or others" in (State.open(str(shared)).disabled_reason or "")


def test_uncreatable_directory_degrades(tmp_path):
    (tmp_path / "file").write_text("")
    s = State.open(str(tmp_path / "file" / "st"))
    assert not s.enabled and "cannot create" in (s.disabled_reason or "")
    assert s.read_json("x") is None and s.latch() is None
    with s.lock("l", time.monotonic() + 1) as got:
        assert got is False


def test_json_roundtrip_atomic_and_corruption_tolerant(tmp_path):
    s = State.open(str(tmp_path / "st"))
    assert s.write_json("r.json", {"v": [1, 2]})
    assert s.read_json("r.json") == {"v": [1, 2]}
    assert [p for p in os.listdir(tmp_path / "st") if p.endswith(".tmp")] == []
    (tmp_path / "st" / "r.json").write_text("{not json")
    assert s.read_json("r.json") is None
    (tmp_path / "st" / "l.json").write_text("[1]")
    assert s.read_json("l.json") is None


def test_threads_writing_one_file_never_leave_it_torn(tmp_path):
    """serve's monitor threads write serve.json at once: every version read is whole JSON."""
    s = State.open(str(tmp_path / "st"))
    path = tmp_path / "st" / "snap.json"
    stop = threading.Event()
    torn: list[str] = []

    def writer(n: int) -> None:
        while not stop.is_set():
            s.write_json("snap.json", {"who": n, "pad": "x" * (n * 97 % 600)})

    def reader() -> None:
        while not stop.is_set():
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
            except ValueError:
                torn.append(text[:80])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(1, 5)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join()
    assert torn == []
    assert [p for p in os.listdir(tmp_path / "st") if p.endswith(".tmp")] == []


def test_planted_symlink_file_is_not_followed(tmp_path):
    s = State.open(str(tmp_path / "st"))
    target = tmp_path / "victim"
    target.write_text(json.dumps({"owned": True}))
    os.symlink(target, tmp_path / "st" / "r.json")
    assert s.read_json("r.json") is None
    assert s.write_json("r.json", {"x": 1})  # replaces the link itself, never writes through it
    assert json.loads(target.read_text()) == {"owned": True}


def test_lock_excludes_and_times_out(tmp_path):
    s = State.open(str(tmp_path / "st"))
    held = threading.Event()
    release = threading.Event()

    def holder():
        with s.lock("t.lock", time.monotonic() + 1) as got:
            assert got
            held.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    start = time.monotonic()
    with s.lock("t.lock", time.monotonic() + 0.3) as got:
        assert got is False
    assert 0.25 <= time.monotonic() - start < 1.0
    release.set()
    t.join()
    with s.lock("t.lock", time.monotonic() + 0.3) as got:
        assert got is True


def test_latch_holds_for_this_life_and_clears_after_restart(tmp_path):
    s = State.open(str(tmp_path / "st"))
    assert s.latch() is None
    assert s.set_latch("torch-cuda", "CUDA error: an illegal memory access was encountered")
    latch = s.latch()
    assert latch and latch["source"] == "torch-cuda" and "illegal memory" in latch["reason"]
    # A new PID 1 (the container restarted) means a new identity.
    data = s.read_json(state_mod.LATCH)
    assert data is not None
    data["identity"] = "another-boot:12345"
    s.write_json(state_mod.LATCH, data)
    assert s.latch() is None
    assert not (tmp_path / "st" / state_mod.LATCH).exists()


def test_identity_is_the_boot_the_pid_namespace_and_procs_mount_with_pid1_beside_it():
    life = state_mod.life()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    ns = os.readlink("/proc/self/ns/pid")
    assert life.ident == f"{boot}:ns{ns[ns.index('[') + 1:-1]}.{os.stat('/proc').st_mtime_ns}"
    assert life.pid1 == str(int(Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19]))


def test_a_latch_of_the_earlier_identity_form_is_honoured_or_cleared_as_written(tmp_path):
    """``<boot>:<PID 1's start>`` (before the pid namespace was in it) still holds in the same
    life and is cleared in another; ``<boot>:?`` (PID 1 was hidden) proves nothing."""
    s = State.open(str(tmp_path / "st"))
    life = state_mod.life()
    assert life.pid1 is not None
    for identity, holds in ((f"{life.boot}:{life.pid1}", True), (f"{life.boot}:{int(life.pid1) + 1}", False),
                            (f"other-boot:{life.pid1}", False), (f"{life.boot}:?", False)):
        assert s.write_json(state_mod.LATCH, {"source": "torch-cuda", "reason": "old", "identity": identity})
        assert (s.latch() is not None) is holds, identity
        assert (tmp_path / "st" / state_mod.LATCH).exists() is holds, identity
    # The new form with another PID 1 beside the same namespace: the kernel reused the inode.
    s.write_json(state_mod.LATCH, {"identity": life.ident, "pid1": str(int(life.pid1) + 1)})
    assert s.latch() is None


def test_state_dir_below_another_users_directory_is_refused(tmp_path):
    """The directories above the state dir are judged as the checks dir's are: a parent another
    user owns (who could move root's latch aside) turns the state dir off, naming it."""
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, 65534, 65534)
    (parent / "st").mkdir(mode=0o700)
    s = State.open(str(parent / "st"))
    assert not s.enabled and f"{parent} is owned by uid 65534" in (s.disabled_reason or ""), s.disabled_reason
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)  # writable by all and not sticky
    assert not State.open(str(open_parent / "st")).enabled
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: nobody else can move what is ours
    assert State.open(str(sticky / "st")).enabled


def test_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        for mask in range(0o177, 0o1000, 0o100):
            os.umask(mask)
            s = State.open(str(tmp_path / f"st-{mask:o}"))
            assert s.enabled, s.disabled_reason
            assert s.write_json("r.json", {"a": 1}) and s.set_latch("torch-cuda", "fatal")
            with s.lock("t.lock", time.monotonic() + 1) as got:
                assert got
            assert stat.S_IMODE(os.stat(tmp_path / f"st-{mask:o}").st_mode) == 0o700, oct(mask)
            for name in ("r.json", state_mod.LATCH, "t.lock"):
                assert stat.S_IMODE(os.stat(tmp_path / f"st-{mask:o}" / name).st_mode) == 0o600, (oct(mask), name)
    finally:
        os.umask(old)


def test_default_locations_never_the_working_directory(monkeypatch, tmp_path):
    uid = os.getuid()
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    for tmpdir, used in (("relative", False), (str(tmp_path / "link"), False), (str(tmp_path / "gone"), False),
                         (str(tmp_path / "real"), True)):
        monkeypatch.setenv("TMPDIR", tmpdir)
        monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")
        found = state_mod.candidates()
        assert all(p.startswith("/") for p in found), found
        assert found[0] == "/run/healthcheck" and found[-2:] == [f"/tmp/healthcheck-{uid}",
                                                                 f"/dev/shm/healthcheck-{uid}"]
        assert (f"{tmp_path}/real/healthcheck-{uid}" in found) is used, (tmpdir, found)


def test_stuck_child_entry_holds_only_while_that_process_lives(tmp_path):
    s = State.open(str(tmp_path / "st"))
    assert s.stuck_child("nvidia-smi") is None
    s.remember_stuck("nvidia-smi", os.getpid())  # a process that certainly exists
    assert s.stuck_child("nvidia-smi") == os.getpid()
    # The same pid with another start time is a reused pid, not our stuck child.
    data = s.read_json("stuck-nvidia-smi.json")
    assert data is not None
    s.write_json("stuck-nvidia-smi.json", {**data, "start": "1"})
    assert s.stuck_child("nvidia-smi") is None
    assert not (tmp_path / "st" / "stuck-nvidia-smi.json").exists()
    # After a container restart (another PID 1) it no longer applies either.
    s.remember_stuck("nvidia-smi", os.getpid())
    data = s.read_json("stuck-nvidia-smi.json")
    assert data is not None
    s.write_json("stuck-nvidia-smi.json", {**data, "identity": "other-boot:1"})
    assert s.stuck_child("nvidia-smi") is None


NESTED = b"[" * 100_000 + b"]" * 100_000


def test_damaged_state_files_are_misses_not_internal_errors(tmp_path):
    """Deep nesting, non-finite and huge numbers, FIFOs: each state file is a miss."""
    from tests.conftest import clean_env, run_cli

    st = tmp_path / "st"
    State.open(str(st))  # created 0700, ours
    for name in ("latch.json", "torch-cuda.json", "stuck-nvidia-smi.json", "serve.json"):
        (st / name).write_bytes(NESTED)
    env = clean_env(HEALTHCHECK_STATE_DIR=str(st), PATH="/usr/bin:/bin", ENABLE_JUPYTER_CHECK="false",
                    ENABLE_SSH_CHECK="false")
    res = run_cli("--profile", "liveness", env=env)
    assert res.returncode == 0 and "internal error" not in res.stdout, res.stdout
    assert "PASS torch-cuda" in res.stdout and "no CUDA-fatal latch" in res.stdout
    res = run_cli("--only", "nvidia-smi", env=env)
    assert res.returncode == 1 and "FAIL nvidia-smi" in res.stdout and "not found on PATH" in res.stdout
    s = State(str(st))
    for raw in (b'{"pid": 1e999}', b'{"pid": ' + b"9" * 5000 + b"}", b'{"time": NaN}', b'{"a": -Infinity}'):
        (st / "x.json").write_bytes(raw)
        assert s.read_json("x.json") is None
    (st / "x.json").unlink()
    os.mkfifo(st / "x.json")
    assert s.read_json("x.json") is None  # never blocks on a FIFO
    (st / "x.json").unlink()
    (st / "x.json").write_text('{"a": {"b": [1, 2.5]}}')
    assert s.read_json("x.json") == {"a": {"b": [1, 2.5]}}


def test_scratch_is_private_in_the_state_dir_and_a_killed_runs_goes_with_the_next(tmp_path):
    import subprocess

    s = State.open(str(tmp_path / "st"))
    mine = s.scratch("ssh-login")
    assert mine is not None and os.path.dirname(mine) == str(tmp_path / "st" / "scratch")
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700
    Path(mine, "known_hosts").write_text("x")
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = tmp_path / "st" / "scratch" / f"kernel-{gone.pid}-1-abcd"  # a run that was killed
    left.mkdir()
    (left / "kernel.json").write_text("{}")
    other = s.scratch("kernel")
    assert other is not None and not left.exists() and os.path.isdir(mine), "a live run's scratch stays"
    state_mod.drop_scratch(mine)
    state_mod.drop_scratch(other)
    assert os.listdir(tmp_path / "st" / "scratch") == []
    assert State.off("tests").scratch("kernel") is None


def test_a_name_another_user_took_first_gives_way_to_ours_beside_it(tmp_path, monkeypatch):
    """In a sticky directory like /tmp: ours is made beside the taken name, and found again by
    the next run by its prefix and owner; a link, another user's directory or an open one with
    that prefix is never ours; a directory too full to look through gets nothing new."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    plain = shared / f"healthcheck-{os.getuid()}"
    plain.mkdir(mode=0o700)
    os.chown(plain, 4242, 4242)
    theirs = shared / f"{plain.name}.0"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, 4242)
    (shared / f"{plain.name}.1").mkdir(mode=0o755)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", shared / f"{plain.name}.2")
    mine = state_mod.beside(str(plain))
    assert mine is not None and mine.startswith(f"{plain}.") and mine[-2:] not in (".0", ".1", ".2"), mine
    st = os.lstat(mine)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o700)
    assert state_mod.beside(str(plain)) == mine and len(list(shared.iterdir())) == 5
    flooded = tmp_path / "flooded"
    flooded.mkdir()
    for i in range(9):
        (flooded / f"f{i}").touch()
    monkeypatch.setattr(state_mod, "MAX_BESIDE", 8)
    assert state_mod.beside(str(flooded / plain.name)) is None and len(list(flooded.iterdir())) == 9
