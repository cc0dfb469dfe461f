"""The state directory: refused when unsafe, atomic files, locks with deadlines, the latch."""

from __future__ import annotations

import json
import os
import threading
import time

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
    assert "belongs to uid 65534" in (State.open(str(foreign)).disabled_reason or "")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert "writable by others" in (State.open(str(shared)).disabled_reason or "")


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


def test_identity_has_boot_and_pid1_start():
    ident = state_mod.pid1_identity()
    boot, start = ident.rsplit(":", 1)
    assert boot and start.isdigit()


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
