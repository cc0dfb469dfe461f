"""What a killed suite left running: ended by the next suite process, by the run marker.

What a SIGKILLed suite leaves and who ends it: docs/probes.md, "Containment". Why this design:

- The workers arm the parent-death signal themselves (worker_base.py), not by the spawner:
  Python's subprocess has no such option, and ``preexec_fn`` is unsafe with the runner's threads
  and gives up the fast vfork path on every spawn, liveness included.
- That signal is not inherited across fork and reaches only the direct child, so everything else
  is found here by its run marker (``HEALTHCHECK_RUN_ID``: ``<suite pid>-<suite start>-<n>-<random>``
  per run): a process that carries the marker of a suite process that is gone is a leftover.
- Not the lock held by the worker (its fd inherited): every later run would wait for a hung
  orphan and report only "lock held", never end it. Not a cgroup: rarely delegated inside a
  container.

The sweep reads each process's /proc/<pid>/stat and the environment of the session leaders
(~1 ms for 100 processes), in a suite process that starts a child, never on a liveness run that
starts none. A leftover that also emptied its environment (``env -i`` after a double fork) is
found only below, or in the session of, one that did not.
"""

from __future__ import annotations

import os
import signal
import time

from probes.deadlines import KILL_WAIT, SWEEP_TIME
from probes.pidstat import DEAD, below, signal_each, stat, table

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

RUN_ID_VAR = "HEALTHCHECK_RUN_ID"  # probes/proc.py sets it
_KEY = RUN_ID_VAR.encode() + b"="
_swept_by: int | None = None  # the pid that made its one sweep at its first child


def suite_of(marker: bytes) -> tuple[int, int] | None:
    """(pid, start) of the suite process that made one run marker; None for one of another form."""
    parts = marker.split(b"-")
    if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def _markers(pid: int) -> list[bytes]:
    """The run markers in a process's environment ([] when none, or it cannot be read)."""
    # os.open/os.read: half the cost of open(); this is read for every process.
    chunks = []
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
        try:
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
    except OSError:
        return []
    return markers(b"".join(chunks))


def markers(environ: bytes) -> list[bytes]:
    """The run markers in the bytes of a /proc/<pid>/environ ([] when none)."""
    at = environ.find(_KEY)
    while at > 0 and environ[at - 1] != 0:
        at = environ.find(_KEY, at + 1)
    if at < 0:
        return []
    end = environ.find(b"\0", at)
    return environ[at + len(_KEY):end if end >= 0 else len(environ)].split(b":")


def _pid_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def leftovers() -> set[int]:
    """The processes that carry the run marker of a suite process that is gone, what is below
    them and what is in the sessions they lead, in this pid namespace (a marker's pid means
    nothing in another).

    Only the environments of session leaders, and of processes whose session leader is gone, are
    read: each child the suite starts leads a session of its own, and a descendant is in that
    session, in one it leads itself (setsid), or in one whose leader died. An environment is read
    through the process's memory map, which a process stuck in a driver may hold: the fewer read,
    the fewer such waits; /proc/<pid>/stat is read without it.
    """
    me = os.getpid()
    mine = set(os.environ.get(RUN_ID_VAR, "").encode().split(b":"))  # our enclosing runs: not ours to judge
    procs = table(alive=True)
    found: set[int] = set()
    for pid, p in procs.items():
        if pid == me or (p.sid != pid and p.sid in procs):
            continue  # in a live session: its leader, or a process above it, tells
        for marker in _markers(pid):
            suite = suite_of(marker)
            if suite is None or marker in mine:
                continue
            cur = procs.get(suite[0])
            if cur is None or cur.start != suite[1]:
                found.add(pid)
                break
    if not found:
        return found
    ns = _pid_ns("self")
    found = {pid for pid in found if _pid_ns(pid) == ns}
    led = {pid for pid in found if procs[pid].sid == pid}
    return below(procs, found | {pid for pid, p in procs.items() if p.sid in led}) - {me}


def end() -> list[int]:
    """End what killed suites left: stop it pass after pass until two passes find nothing new
    (it forks no more), then kill it all. Returns the pids still there after KILL_WAIT (state D:
    the kernel does not let them die), [] when nothing was left."""
    found = leftovers()
    if not found:
        return []
    stopped: dict[int, int] = {}
    limit = time.monotonic() + SWEEP_TIME
    calm = 0
    try:
        while found and calm < 2 and time.monotonic() < limit:
            new = {pid for pid in found if pid not in stopped}
            for pid in new:
                st = stat(pid)
                if st is not None:
                    stopped[pid] = st.start
            signal_each(new, signal.SIGSTOP)
            calm = 0 if new else calm + 1
            time.sleep(0.002)  # for an execve to end: its new environment is then readable
            found = leftovers()
    finally:
        signal_each(stopped, signal.SIGKILL)
    _reap(stopped)
    wait_until = time.monotonic() + KILL_WAIT
    while True:
        left = [pid for pid, start in stopped.items() if _alive(pid, start)]
        if not left or time.monotonic() >= wait_until:
            return left
        time.sleep(0.005)
        _reap(stopped)


def _alive(pid: int, start: int) -> bool:
    st = stat(pid)
    return st is not None and st.start == start and st.state not in DEAD


def _reap(pids: Iterable[int]) -> None:
    """Reap those re-parented to us (this process is a subreaper above the killed suite)."""
    me = os.getpid()
    for pid in pids:
        st = stat(pid)
        if st is not None and st.ppid == me and st.state in DEAD:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def sweep_once() -> None:
    """end(), once per process: at the first child it starts (proc.spawn)."""
    global _swept_by
    me = os.getpid()
    if _swept_by != me:
        _swept_by = me
        end()
