"""How probes.proc reads what a child writes, and names why a child could not be started."""

from __future__ import annotations

import errno
import os

from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import selectors
    from collections.abc import Mapping

MAX_STDERR = 64 * 1024  # stderr kept; the rest is dropped without making the result "truncated"
LIMITED = "could not start: "  # how a spawn error that a resource limit caused begins (limited())


def _soft(which: str) -> str:
    """``RLIMIT_X=N`` (or ``unlimited``, or ``?``): this process's soft limit."""
    # sysconf() reads these without opening a file: at the open-file limit, resource may not load.
    sysconf = {"RLIMIT_NOFILE": "SC_OPEN_MAX", "RLIMIT_NPROC": "SC_CHILD_MAX"}
    try:
        if which in sysconf:
            value = os.sysconf(sysconf[which])
        else:
            import resource

            value = resource.getrlimit(getattr(resource, which))[0]  # RLIM_INFINITY is -1 here
    except (ImportError, AttributeError, ValueError, OSError):
        return f"{which}=?"
    return f"{which}={'unlimited' if value < 0 else value}"


def limit_words(err: int | None) -> str | None:
    """The resource limit that answered ``err``, named with its remedy; None when it is no limit's."""
    if err == errno.EMFILE:
        return (f"too many open files ({_soft('RLIMIT_NOFILE')}): raise the container's open-file limit "
                "(docker run --ulimit nofile=1024:1024, or the runtime's default)")
    if err == errno.ENFILE:
        return "the system's open-file table is full (ENFILE): the node's fs.file-max is reached"
    if err == errno.EAGAIN:
        return (f"process limit reached ({_soft('RLIMIT_NPROC')}, or the container's pids limit): raise it "
                "(docker run --pids-limit / --ulimit nproc, the pod's pids limit) or find what uses it up")
    if err == errno.ENOMEM:
        return (f"out of memory ({_soft('RLIMIT_AS')}, or the container's memory limit): raise the "
                "container's memory or address-space limit")
    return None


def limited(spawn_error: str | None) -> bool:
    return spawn_error is not None and spawn_error.startswith(LIMITED)


def spawn_error(exc: OSError, program: str, env: Mapping[str, str] | None, cwd: str | None) -> str:
    """Why ``program`` could not be started, in words (``LIMITED`` first for a resource limit)."""
    words = limit_words(exc.errno)
    if words is not None:
        return LIMITED + words
    if exc.errno == errno.ENOENT:
        if cwd is not None and exc.filename == cwd:
            return "working directory not found"
        # exec answers ENOENT for a file that is there when its #! interpreter (or a binary's
        # dynamic loader) is not: look the program up as exec does.
        dirs = [cwd or ""] if "/" in program else os.get_exec_path(dict(env) if env is not None else None)
        there = any(os.path.isfile(os.path.join(d, program)) for d in dirs)
        return "interpreter missing" if there else "not found"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOEXEC:
        return "not an executable"
    return errno.errorcode.get(exc.errno or 0, "cannot start").lower()


class Output(Record):  # a child's stdout (to max_output bytes) and stderr (to MAX_STDERR); cut: more came
    out_fd: int
    err_fd: int
    max_output: int

    def __post_init__(self) -> None:
        self.bufs = {self.out_fd: bytearray(), self.err_fd: bytearray()}
        self.limits = {self.out_fd: self.max_output, self.err_fd: MAX_STDERR}
        self.cut = {self.out_fd: False, self.err_fd: False}

    def read(self, fd: int) -> int:
        """One read: the bytes kept, 0 when none are waiting or there is no room left, -1 at end of file."""
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return 0
        if not chunk:
            return -1
        kept = chunk[:max(self.limits[fd] - len(self.bufs[fd]), 0)]
        self.bufs[fd] += kept
        self.cut[fd] |= len(kept) < len(chunk)
        return len(kept)

    def drain(self, sel: selectors.BaseSelector) -> None:
        """What an exited child left, until each pipe is empty or its buffer full (a grandchild writes on)."""
        for key in list(sel.get_map().values()):
            while self.read(key.fd) > 0:
                pass

    def stdout(self) -> bytes:
        return bytes(self.bufs[self.out_fd])
