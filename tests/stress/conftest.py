"""Fixtures for the stress suite: fault-injecting stubs that carry a marker, real servers,
leak counters.

Every fault stub renames its long-lived processes with ``exec -a <marker>-...`` so that
a leftover anywhere on the machine is found by its command line, whoever its parent is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.descendants import hang, template
from tests.servers import Jupyter, Sshd

FAKES = ROOT / "tests" / "fakes"
FAKE_LIB = FAKES / "build" / "libnvidia-ml.so.1"
VENV_PY = str(ROOT / ".venv" / "bin" / "python")

GPU_LINE = "echo '0, NVIDIA H100 80GB HBM3, GPU-00000000-1111-2222-3333-000000000000'"

# Stub nvidia-smi bodies (bash, so that `exec -a` can put the marker into argv[0]).
SMI = {
    "ok": f"{GPU_LINE}\nexit 0",
    "exit9": ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\n"
              "exit 9"),
    "hang": "exec -a {m}-smi-hang sleep 300",
    "ignore-term": "trap '' TERM\n(exec -a {m}-smi-noterm sleep 300)\nexit 0",
    # Exits at once with its answer; a grandchild keeps stdout open (and ignores SIGTERM).
    "grandchild": f"(trap '' TERM; exec -a {{m}}-smi-grandchild sleep 300) &\n{GPU_LINE}\nexit 0",
    # A grandchild in its own process group (job control), still in the child's session.
    "own-group": ("set -m\n(trap '' TERM; exec -a {m}-smi-owngroup sleep 300) &\n"
                  "exec -a {m}-smi-hang2 sleep 300"),
    "huge": "head -c 3000000 /dev/zero | tr '\\0' x\nexit 0",
    "signal": "kill -SEGV $$\nsleep 1",
    # Descendants that leave the child's session or group (tests/descendants.py).
    "setsid": f"{template('setsid')}\n{GPU_LINE}\nexit 0",
    "double-fork": f"{template('double-fork')}\n{GPU_LINE}\nexit 0",
    "storm": f"{template('storm')}\n{hang('{m}')}",
    "term-fork": template("term-fork"),
}

# Stand-ins for the image's python (HEALTHCHECK_TORCH_PYTHON).
TORCH = {
    "hang": "trap '' TERM\nexec -a {m}-torch-hang sleep 300",
    "garbage": "echo 'HEALTHCHECK-TORCH-RESULT {{not json'\nexit 0",
    "crash": "echo 'Segmentation fault' >&2\nkill -SEGV $$",
    "grandchild": "(trap '' TERM; exec -a {m}-torch-grandchild sleep 300) &\nexit 1",
    "setsid": f"{template('setsid')}\nexit 1",
    "double-fork": f"{template('double-fork')}\nexit 1",
    "storm": f"{template('storm')}\n{hang('{m}')}",
    "term-fork": template("term-fork"),
}


def write_exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def marker() -> str:
    return f"hcstress-{uuid.uuid4().hex[:10]}"


def kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


def descendants() -> set[int]:
    """Live descendants of this process (zombies are not leaks: nothing holds them)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
    return out


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def fake_nvml_env() -> dict[str, str] | None:
    """LD_LIBRARY_PATH for the fake libnvidia-ml.so.1, built on demand; None when it cannot be."""
    if not FAKE_LIB.exists() and shutil.which("make"):
        subprocess.run(["make", "-s", "-C", str(FAKES)], capture_output=True, timeout=120, check=False)
    if not FAKE_LIB.exists():
        return None
    return {"LD_LIBRARY_PATH": str(FAKE_LIB.parent)}


# ---------------------------------------------------------------- real servers on loopback

def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@pytest.fixture(scope="session")
def sshd_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real OpenSSH server on a loopback port."""
    why = Sshd.missing()
    if why:
        pytest.skip(why)
    server = Sshd(tmp_path_factory.mktemp("sshd"), ipv6=False).start()
    try:
        yield server.port
    finally:
        server.stop()


@pytest.fixture(scope="session")
def jupyter_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A real Jupyter Server on a loopback port; yields (port, runtime dir)."""
    pytest.importorskip("jupyter_server")
    server = Jupyter(tmp_path_factory.mktemp("jupyter"), token="stress-not-a-secret")
    try:
        yield server.port, server.runtime
    finally:
        server.stop()


SILENT = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(4096)
print(s.getsockname()[1], flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="session")
def silent_port() -> Iterator[int]:
    """A loopback port that completes the TCP handshake and never says a word (a hung server).

    It runs in its own process so that its sockets do not count against this process's fds."""
    proc = subprocess.Popen([VENV_PY, "-c", SILENT], stdout=subprocess.PIPE, start_new_session=True)
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        yield port
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
        _stop(proc)
