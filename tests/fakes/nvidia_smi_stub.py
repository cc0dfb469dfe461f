"""Stub ``nvidia-smi`` executables for tests (see README.md beside this file).

Each stub is a small POSIX shell script written into a bin directory that the test puts
first on PATH. Every process a stub starts appends its pid to ``BIN/nvidia-smi.pids``
so a test can assert that nothing is left running afterwards.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

# What the real nvidia-smi prints for each exit code it documents.
MESSAGES = {
    6: "No devices were found",
    9: ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."),
    12: ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that "
         "the NVIDIA Display Driver is properly installed and present in your system."),
    14: "infoROM is corrupted at gpu 0000:41:00.0",
    15: ("Unable to determine the device handle for GPU 0000:41:00.0: GPU is lost.  "
         "Reboot the system to recover this GPU"),
    255: "Failed to initialize NVML: Unknown Error",
}

BEHAVIOURS = ("ok", "exit", "garbage", "huge", "hang", "ignore-term", "grandchild", "lost", "signal", "sample")


def gpu_rows(gpus: int, name: str = "NVIDIA A100-SXM4-80GB") -> str:
    return "".join(f"{i}, {name}, GPU-{i:08x}-1111-2222-3333-{i:012x}\n" for i in range(gpus))


def write_stub(bin_dir: str | os.PathLike[str], behaviour: str, *, gpus: int = 2, code: int = 9,
               sleep: float = 60.0, name: str = "NVIDIA A100-SXM4-80GB", text: bytes = b"") -> Path:
    """Write ``bin_dir/nvidia-smi`` acting out ``behaviour``; returns its path.

    ``sample`` prints ``text`` byte for byte (a real capture) and exits with ``code``."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown stub behaviour {behaviour!r} (known: {', '.join(BEHAVIOURS)})")
    bin_path = Path(bin_dir)
    bin_path.mkdir(parents=True, exist_ok=True)
    pids = shlex.quote(str(bin_path / "nvidia-smi.pids"))
    sample = bin_path / "nvidia-smi.sample"
    if behaviour == "sample":
        sample.write_bytes(text)
    rows = shlex.quote(gpu_rows(gpus, name))
    body = {
        "ok": f"printf '%s' {rows}\nexit 0",
        "exit": (f"echo {shlex.quote(MESSAGES.get(code, 'error'))}\n"
                 f"{'printf %s ' + rows if code == 14 else ''}\nexit {code}"),
        "garbage": "printf '\\001\\002 not csv at all \\377\\376 <html>\\n'\nexit 0",
        "huge": "i=0\nwhile [ $i -lt 20000 ]; do echo \"0, $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; "
                "i=$((i+1)); done\nexit 0",
        "hang": f"exec sleep {sleep}",
        "ignore-term": f"trap '' TERM\nsleep {sleep}\nsleep {sleep}",
        # The grandchild inherits stdout and keeps the pipe open after the stub exits.
        "grandchild": (f"sh -c 'echo $$ >> {pids}; exec sleep {sleep}' &\n"
                       f"printf '%s' {rows}\nexit 0"),
        "lost": (f"printf '%s' {shlex.quote(gpu_rows(1, name))}\n"
                 "echo 'Unable to determine the device handle for GPU0000:41:00.0: Unknown Error'\n"
                 "exit 255"),
        "signal": "kill -SEGV $$\nsleep 1",
        "sample": f"cat {shlex.quote(str(sample))}\nexit {code}",
    }[behaviour]
    script = f"#!/bin/sh\necho $$ >> {pids}\n{body}\n"
    path = bin_path / "nvidia-smi"
    path.write_text(script)
    path.chmod(0o755)
    return path


def started_pids(bin_dir: str | os.PathLike[str]) -> list[int]:
    """Pids of every process the stubs in ``bin_dir`` started."""
    f = Path(bin_dir) / "nvidia-smi.pids"
    if not f.exists():
        return []
    return [int(x) for x in f.read_text().split() if x.strip().isdigit()]
