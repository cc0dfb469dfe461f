"""A process's line of /proc/<pid>/stat: state, parent, group, session and start time.

The one reader of that file in the suite: the sweeps in ``probes.proc`` read it for every
process, and ``probes.state`` reads it for a process's start time (a latch's identity).
"""

from __future__ import annotations

import os

from probes.record import Record


class Proc(Record):
    """What a sweep needs from /proc/<pid>/stat."""

    __slots__ = ("state", "ppid", "pgid", "sid", "start")

    state: bytes  # R, S, D, T, Z, ...
    ppid: int
    pgid: int
    sid: int
    start: int  # clock ticks since boot: tells a reused pid apart

    def __init__(self, state: bytes, ppid: int, pgid: int, sid: int, start: int) -> None:
        self.state = state
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        self.start = start


def stat(pid: int) -> Proc | None:
    """The process ``pid``'s line of /proc/<pid>/stat, or None when it is gone."""
    # os.open/os.read: half the cost of open(); a sweep reads this for every process.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
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
