"""How a child ended: a child cut by the deadline is the deadline, a child that finished is judged by
all it wrote, and a file whose interpreter is missing is not a program that is missing."""

from __future__ import annotations

import contextlib
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes import dropins, proc
from probes.config import Config
from probes.context import Context
from probes.hardware import nvidia_smi
from probes.state import State
from tests.fakes.nvidia_smi_stub import write_stub

ROWS = b"0, NVIDIA H100 80GB HBM3, GPU-00000000-0000-0000-0000-000000000000\n" * 2


@contextlib.contextmanager
def starved() -> Iterator[None]:
    """The run's thread looks again only after its child has finished and its deadline has passed,
    as on a loaded machine, whatever the machine's real load: another thread takes the GIL once the
    run has started its child and keeps it (ctypes.PyDLL calls never release it) while it waits for
    that child to exit (waitid with WNOWAIT: the child stays the run's to reap) and 0.1 s more."""
    import ctypes
    import os

    libc = ctypes.PyDLL(None, use_errno=True)
    before = set(proc._children)
    done = threading.Event()

    def hold() -> None:
        while not done.is_set():
            new = set(proc._children) - before
            if new:
                siginfo = ctypes.create_string_buffer(256)
                libc.waitid(os.P_PID, max(new), siginfo, os.WEXITED | os.WNOWAIT)
                libc.usleep(100_000)
                return

    t = threading.Thread(target=hold)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()


@pytest.mark.parametrize(("script", "code", "out", "err"), [
    ("printf '%s' \"$ROWS\"", 0, ROWS, b""),
    ("echo 'CRITICAL: model not loaded'; exit 2", 2, b"CRITICAL: model not loaded\n", b""),
    ("head -c 60000 /dev/zero | tr '\\0' x; exit 1", 1, b"x" * 60000, b""),  # fits the pipe: it can exit
    ("echo 'Failed to initialize NVML: Unknown Error' >&2; exit 255", 255, b"",
     b"Failed to initialize NVML: Unknown Error\n"),
])
def test_a_child_that_finished_before_a_starved_run_looked_is_judged_by_all_it_wrote(script, code, out, err):
    completed = 0
    for _ in range(10):
        with starved():
            res = proc.run(["sh", "-c", script], deadline=time.monotonic() + 0.05, env={"ROWS": ROWS.decode(),
                                                                                       "PATH": "/usr/bin:/bin"})
        # Either it is the deadline, or it is everything the child wrote with its exit status.
        assert res.timed_out or (res.returncode == code, res.stdout, res.stderr) == (True, out, err), res
        completed += not res.timed_out
        if completed >= 2:
            break
    assert completed, "the child never finished before the run looked"


def elf_with_missing_loader(tmp_path: Path) -> Path | None:
    """A copy of /bin/true whose ELF interpreter (PT_INTERP, the dynamic loader) names a file
    that does not exist; None when /bin/true is not a dynamic 64-bit little-endian ELF."""
    data = bytearray(Path(shutil.which("true") or "/bin/true").read_bytes())
    if data[:6] != b"\x7fELF\x02\x01":
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        base = phoff + i * phentsize
        p_type, = struct.unpack_from("<I", data, base)
        if p_type == 3:  # PT_INTERP
            offset, = struct.unpack_from("<Q", data, base + 8)
            size, = struct.unpack_from("<Q", data, base + 32)
            data[offset + size - 2] = ord("Z")  # the last character before the NUL
            path = tmp_path / "loaderless"
            path.write_bytes(bytes(data))
            path.chmod(0o755)
            return path
    return None


def test_a_script_whose_interpreter_is_missing_is_not_a_missing_program(tmp_path):
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text("#!/opt/nowhere/python3\nprint('0, x, GPU-1')\n")
    script.chmod(0o755)
    by_path = proc.run([str(script)], deadline=time.monotonic() + 2)
    assert by_path.spawn_error == "interpreter missing" and by_path.returncode is None
    by_name = proc.run(["nvidia-smi"], deadline=time.monotonic() + 2, env={"PATH": f"/nonexistent:{script.parent}"})
    assert by_name.spawn_error == "interpreter missing"
    relative = proc.run(["./nvidia-smi"], deadline=time.monotonic() + 2, cwd=str(script.parent))
    assert relative.spawn_error == "interpreter missing"
    gone = proc.run(["nvidia-smi"], deadline=time.monotonic() + 2, env={"PATH": str(tmp_path)})
    assert gone.spawn_error == "not found"


def test_a_binary_whose_loader_is_missing_is_not_a_missing_program(tmp_path):
    binary = elf_with_missing_loader(tmp_path)
    if binary is None:
        pytest.skip("/bin/true is not a dynamic 64-bit little-endian ELF here")
    assert proc.run([str(binary)], deadline=time.monotonic() + 2).spawn_error == "interpreter missing"


def test_a_missing_working_directory_is_named_as_such(tmp_path):
    res = proc.run(["true"], deadline=time.monotonic() + 2, cwd=str(tmp_path / "gone"))
    assert res.spawn_error == "working directory not found"


# ---- the judges that read Completed: the real gather under the same starvation -------------------

def test_nvidia_smi_that_finished_unseen_is_never_zero_gpus(tmp_path, monkeypatch):
    write_stub(tmp_path, "ok", gpus=2)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    seen = set()
    for _ in range(5):
        c = Context(Config(gpu_count=1), time.monotonic() + 0.05, {}, State.off("tests"))
        with starved():
            r = nvidia_smi.judge(nvidia_smi.gather(c), c)
        assert (r.reason, r.observed) in ((None, 2), ("deadline", None)), r
        seen.add(r.reason)
    assert None in seen, "nvidia-smi never finished before the run looked"


def test_a_drop_in_that_finished_unseen_keeps_its_message(tmp_path):
    checks = tmp_path / "healthcheck.d"
    checks.mkdir(mode=0o755)
    (checks / "licence").write_text("#!/bin/sh\necho 'CRITICAL: licence server down'\nexit 2\n")
    (checks / "licence").chmod(0o755)
    spec = dropins.specs(str(checks))[0]
    said = set()
    for _ in range(5):
        c = Context(Config(), time.monotonic() + 0.05, {}, State.off("tests"), spec=spec)
        with starved():
            r = dropins.judge(dropins.gather(c), c)
        assert r.reason in ("check-failed", "deadline") and "with no message" not in r.message, r
        said.add(r.message)
    assert "CRITICAL: licence server down" in said
