"""What a SIGKILLed suite left running (docs/probes.md, "Containment"), found by the run marker
``HEALTHCHECK_RUN_ID`` (``<suite pid>-<suite start>-<n>-<random>``) of a suite process that is gone,
and killed by pid and start time by the next one. Not by the worker's lock (every later run would
wait for a hung orphan, never end it), nor a cgroup (rarely delegated inside a container)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from probes.deadlines import KILL_WAIT
from probes.pidstat import DEAD, below, signal_same, stat, table

RUN_ID_VAR = "HEALTHCHECK_RUN_ID"  # probes/proc.py sets it
_KEY = RUN_ID_VAR.encode() + b"="


def marked(pid: int) -> list[bytes] | None:
    """Its run markers; None when its environment is empty (in execve, or env -i) or unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read()
    except OSError:
        return None
    if not env:
        return None
    return next((e[len(_KEY):].split(b":") for e in env.split(b"\0") if e.startswith(_KEY)), [])


def _pid_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def find() -> dict[int, int]:
    """pid -> start of each process in this pid namespace marked by a gone suite process, below one, or in
    a session one leads. Only leaders' environments (and leaderless ones') are read: a suite's child leads."""
    me = os.getpid()
    mine = set(os.environ.get(RUN_ID_VAR, "").encode().split(b":"))  # our enclosing runs: not ours to judge
    procs = table(alive=True)
    found = set()
    for pid, p in procs.items():
        if pid == me or (p.sid != pid and p.sid in procs):
            continue  # in a live session: its leader, or a process above it, tells
        for marker in marked(pid) or ():
            parts = marker.split(b"-")
            if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit() and marker not in mine:
                cur = procs.get(int(parts[0]))
                if cur is None or cur.start != int(parts[1]):
                    found.add(pid)
    ns = _pid_ns("self")
    led = {pid for pid in found if procs[pid].sid == pid and _pid_ns(pid) == ns}
    found = {pid for pid in found if _pid_ns(pid) == ns} | {pid for pid, p in procs.items() if p.sid in led}
    return {pid: procs[pid].start for pid in below(procs, found) - {me}}


def end(found: dict[int, int] | None = None) -> list[int]:
    """SIGKILL each process of ``found`` (pid -> start; find()'s when None) still the one that started
    then, and what find() finds after, until none is left, reaping those re-parented to us. Returns
    the pids still there after KILL_WAIT (state D)."""
    me, limit = os.getpid(), time.monotonic() + KILL_WAIT
    left = dict(find() if found is None else found)
    killed: dict[int, int] = {}
    while left:
        killed.update((pid, start) for pid, start in left.items() if signal_same(pid, start, signal.SIGKILL))
        for pid, start in killed.items():
            st = stat(pid)
            if st is not None and st.start == start and st.state in DEAD and st.ppid == me:
                with contextlib.suppress(ChildProcessError):  # reaped meanwhile by proc's final sweep
                    os.waitpid(pid, os.WNOHANG)
        if time.monotonic() >= limit:
            break
        time.sleep(0.005)
        left = {pid: start for pid, start in {**killed, **find()}.items()
                if (st := stat(pid)) is not None and st.start == start and st.state not in DEAD}
    return [pid for pid, start in killed.items()
            if (st := stat(pid)) is not None and st.start == start and st.state not in DEAD]

