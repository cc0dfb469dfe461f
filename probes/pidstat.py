"""A process's line of /proc/<pid>/stat (state, parent, group, session, start time), the process
table and tree built from it, and a signal to a process named by pid and start time."""

from __future__ import annotations

import os

from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

DEAD = (b"Z", b"X")


class Proc(Record):
    state: bytes  # R, S, D, T, Z, ...
    ppid: int
    pgid: int
    sid: int
    start: int  # clock ticks since boot: tells a reused pid apart


def stat(pid: int) -> Proc | None:
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)  # os.open: half the cost of open(), read per process
        try:
            data = os.read(fd, 1024)  # the command name is at most 16 bytes: the fields fit
        finally:
            os.close(fd)
    except OSError:
        return None
    # Fields after the command name (which may contain spaces and parentheses).
    fields = data[data.rfind(b")") + 2:].split(None, 20)
    try:
        return Proc(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def table(alive: bool = False) -> dict[int, Proc]:
    """Every process this /proc shows, by pid (``alive``: zombies and dead ones left out)."""
    found: dict[int, Proc] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit():
            st = stat(int(entry))
            if st is not None and not (alive and st.state in DEAD):
                found[int(entry)] = st
    return found


def below(procs: Mapping[int, Proc], roots: Iterable[int]) -> set[int]:
    """``roots`` and everything under them in the parent tree."""
    kids: dict[int, list[int]] = {}
    for pid, p in procs.items():
        kids.setdefault(p.ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(kids.get(pid, ()))
    return found


def signal_same(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only while it is the process that started at ``start`` (by pidfd where the
    kernel has them, so no reuse comes between check and signal; else by kill() right after). True: sent."""
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd (kernel before 5.3): check, then kill
        pass
    try:
        st = stat(pid)
        if st is None or st.start != start or st.state in DEAD:
            return False
        if fd is None:
            os.kill(pid, sig)
        else:
            import signal

            signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)

