"""Run a child process that may hang, without ever hanging the caller.

The child runs in its own session (so its whole process group can be signalled),
its output is read with a deadline (a grandchild that keeps the pipe open cannot
hold us), and at the deadline the group gets SIGTERM, then SIGKILL. A child stuck
in uninterruptible sleep (a wedged driver) survives SIGKILL: we wait only a short,
bounded time for it, report it as stuck, and move on.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
    from probes.state import State

TERM_GRACE = 0.15  # seconds between SIGTERM and SIGKILL
KILL_WAIT = 0.15  # seconds we wait for the group to vanish after SIGKILL
DRAIN_AFTER_EXIT = 0.05  # output still in the pipe after the child exits
MAX_OUTPUT = 64 * 1024  # stdout kept, by default (run's max_output)
MAX_STDERR = 64 * 1024  # stderr kept; the rest is dropped without making the result "truncated"
LINGER = 1.0  # seconds a child gets to exit once ``until`` says its answer is complete


class Completed(NamedTuple):
    argv: tuple[str, ...]
    returncode: int | None  # None: still there after SIGKILL (stuck) or never started
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False  # the deadline passed before the child finished
    stuck: bool = False  # it survived SIGKILL (uninterruptible sleep)
    truncated: bool = False  # stdout beyond max_output was discarded (stdout only)
    spawn_error: str | None = None  # "not found", "permission denied", ...
    elapsed: float = 0.0
    pid: int | None = None
    held_by: int | None = None  # not started: this earlier child is still stuck (see run's key)
    stderr_truncated: bool = False  # stderr beyond MAX_STDERR was discarded
    lingered: bool = False  # ``until`` was met but the child did not exit by itself: it was ended

    @property
    def signal(self) -> int | None:
        """The signal that killed the child, if one did."""
        if self.returncode is not None and self.returncode < 0:
            return -self.returncode
        return None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _session_members(sid: int) -> list[int]:
    """Processes still in the child's session (grandchildren that changed group)."""
    pids: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces and parentheses).
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
            pids.append(int(entry))
    return pids


def _kill_all(pid: int, sig: int) -> None:
    _signal_group(pid, sig)
    for member in _session_members(pid):
        try:
            os.kill(member, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _spawn_error(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "not found"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOEXEC:
        return "not an executable"
    return errno.errorcode.get(exc.errno or 0, "cannot start").lower()


def run(argv: Sequence[str], *, deadline: float, env: Mapping[str, str] | None = None,
        cwd: str | None = None, max_output: int = MAX_OUTPUT, state: State | None = None,
        key: str | None = None, until: Callable[[bytes], bool] | None = None,
        linger: float = LINGER) -> Completed:
    """Run ``argv`` until it exits or ``deadline`` (a time.monotonic() value) passes.

    Returns within about ``TERM_GRACE + KILL_WAIT`` seconds of the deadline, whatever
    the child does, and leaves no member of its process group or session behind
    (except one the kernel will not let die). With ``state`` and ``key``, a child that
    survives SIGKILL is remembered, and while it exists no new one is started under the
    same key: the result is ``stuck`` with ``held_by`` set, at once.

    Output: the first ``max_output`` bytes of stdout are kept and ``truncated`` says that
    more was discarded; ``truncated`` is about stdout only. The first ``MAX_STDERR`` bytes
    of stderr are kept and the rest is dropped silently (``stderr_truncated``), so a child
    that floods stderr still gives a valid, untruncated stdout.

    ``until``: called with the stdout read so far whenever more arrives; once it returns
    true (the answer is complete, e.g. a whole result line arrived) the child gets at most
    ``linger`` more seconds (never past ``deadline``) to exit by itself. If it has not, it
    is ended as at the deadline, and the result has ``timed_out`` and ``lingered`` set:
    the answer came, but the process did not go. ``until`` must be cheap and must not raise.
    """
    # Imported here: probes that only read state (liveness) import this module for
    # excerpt(), and subprocess + selectors cost ~6 ms of every run's start-up.
    import selectors
    import subprocess

    start = time.monotonic()
    argv = tuple(argv)
    guard = state if state is not None and key else None
    if guard is not None:
        held = guard.stuck_child(key)  # type: ignore[arg-type]
        if held is not None:
            return Completed(argv, None, stuck=True, held_by=held, elapsed=time.monotonic() - start)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=None if env is None else dict(env), cwd=cwd, start_new_session=True, close_fds=True)
    except OSError as exc:
        return Completed(argv, None, spawn_error=_spawn_error(exc), elapsed=time.monotonic() - start)

    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    limits = {out_fd: max_output, err_fd: MAX_STDERR}
    cut = {out_fd: False, err_fd: False}
    timed_out = False
    answered = False  # until() was met
    end = deadline  # the deadline, or earlier once until() is met
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= end:
                timed_out = proc.poll() is None
                break
            if proc.poll() is not None:
                exited_at = exited_at or now
                if now - exited_at >= DRAIN_AFTER_EXIT:
                    break  # a grandchild holds the pipe: stop reading, it is killed below
            wait = min(end - now, 0.05 if exited_at is None else DRAIN_AFTER_EXIT)
            for ready, _ in sel.select(timeout=max(wait, 0.0)):
                fd = ready.fd
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = bufs[fd]
                room = limits[fd] - len(buf)
                if room > 0:
                    buf += chunk[:room]
                if len(chunk) > room:
                    cut[fd] = True
                if fd == out_fd and until is not None and not answered and room > 0 and until(bytes(buf)):
                    answered = True
                    end = min(deadline, time.monotonic() + max(linger, 0.0))
    finally:
        sel.close()

    returncode = None
    if not timed_out:
        remaining = end - time.monotonic()
        try:
            returncode = proc.wait(timeout=max(remaining, 0.0))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        _kill_all(proc.pid, signal.SIGTERM)
        try:
            returncode = proc.wait(timeout=TERM_GRACE)
        except subprocess.TimeoutExpired:
            pass
    # Whatever is left of the group or session (the child itself if it ignored
    # SIGTERM, grandchildren in any case) gets SIGKILL.
    _kill_all(proc.pid, signal.SIGKILL)
    if returncode is None:
        try:
            returncode = proc.wait(timeout=KILL_WAIT)
        except subprocess.TimeoutExpired:
            pass  # uninterruptible sleep: do not wait for it any longer
    for stream in (proc.stdout, proc.stderr):
        try:
            stream.close()  # type: ignore[union-attr]
        except OSError:
            pass
    if returncode is None and guard is not None:
        guard.remember_stuck(key, proc.pid)  # type: ignore[arg-type]
    return Completed(argv, returncode, bytes(bufs[out_fd]), bytes(bufs[err_fd]), timed_out=timed_out,
                     stuck=returncode is None, truncated=cut[out_fd], elapsed=time.monotonic() - start,
                     pid=proc.pid, stderr_truncated=cut[err_fd], lingered=answered and timed_out)


def excerpt(data: bytes, limit: int = 120) -> str:
    """A short, printable, single-line excerpt of untrusted output for a message."""
    text = data.decode("utf-8", "replace").strip()
    text = " ".join(text.split())
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
