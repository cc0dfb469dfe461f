"""Run a child process that may hang, without ever hanging the caller, and leave nothing behind
(docs/probes.md, "Containment"; what a SIGKILLed suite left: probes/orphans.py)."""
from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time

from probes import childio, orphans
from probes.deadlines import DRAIN_AFTER_EXIT, DYING_WAIT, KILL_WAIT, LINGER, TERM_GRACE
from probes.pidstat import DEAD, below, signal_same, stat, table
from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping, Sequence
    from typing import IO, Any, Callable

    from probes.pidstat import Proc
    from probes.state import State

    Select = Callable[[Mapping[int, Proc]], "tuple[set[int], bool]"]  # (the run's pids, one not told yet)

MAX_OUTPUT = 64 * 1024  # stdout kept, by default (run's max_output)
MAX_RUN_IDS = 16  # markers of enclosing runs kept (serve -> CLI -> tool is 2 deep)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


class Completed(Record):
    argv: tuple[str, ...]
    returncode: int | None  # None: still there after SIGKILL (stuck) or never started
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False  # not exited at the deadline: a verdict of deadline, never of its output
    stuck: bool = False  # it survived SIGKILL (uninterruptible sleep)
    truncated: bool = False  # stdout beyond max_output was discarded (stdout only)
    spawn_error: str | None = None  # "not found", "permission denied", ...
    elapsed: float = 0.0
    held_by: int | None = None  # not started: this earlier child is still stuck (see run's key)
    stderr_truncated: bool = False  # stderr beyond childio.MAX_STDERR was discarded
    lingered: bool = False  # ``until`` was met but the child did not exit by itself: it was ended

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


class _Child(Record):  # a child started by spawn(): only its Popen object ever reaps it
    popen: subprocess.Popen[bytes]
    run_id: bytes
    start: int
    ended: bool = False  # end() gave up on it (stuck): forgotten once its Popen has reaped it


_lock = threading.Lock()  # held while a child is started and registered, and while we reap
_children: dict[int, _Child] = {}
_reaper = (0, False)  # (the pid that asked to be the child subreaper, the kernel's answer)
_swept_by = 0  # the pid that ended what gone suites left (orphans.end), at its first child
_prctl: Any = None  # libc's prctl, resolved before the first fork: the child may call no more than it
_ids = itertools.count(1)


def subreaper() -> bool:
    """Become the child subreaper (a run's orphans come to us), once per process; False if refused."""
    global _reaper, _prctl
    with _lock:
        if _reaper[0] != os.getpid():
            try:
                if _prctl is None:
                    import ctypes  # only once a child is started

                    _prctl = ctypes.CDLL(None, use_errno=True).prctl
                _reaper = (os.getpid(), _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
            except (OSError, AttributeError):
                _reaper = (os.getpid(), False)
    return _reaper[1]


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
          stdout: int | IO[Any] | None = -1, stderr: int | IO[Any] | None = -1,
          user: tuple[int, int] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` as run() does (own session, stdin from /dev/null, the run marker, the
    parent-death signal); end it with end() from a thread that lives as long as the child.
    ``user``: (uid, gid) to run as, with no supplementary group. OSError when it cannot start."""
    # logging registers paired fork hooks at import. Imported by another probe's thread while this one
    # forks (between the hooks, waiting for the import lock, the interpreter lock is let go), its
    # after-fork hook alone runs and prints a traceback to the report's stderr: so it comes first.
    import logging  # noqa: F401
    import subprocess

    global _swept_by
    drop: dict[str, Any] = {}
    if user is not None and user != (os.geteuid(), os.getegid()):
        drop = {"user": user[0], "group": user[1], "extra_groups": []}
    subreaper()
    if _swept_by != os.getpid():
        _swept_by = os.getpid()
        orphans.end()
    prctl, parent = _prctl, os.getpid()

    def die_with_us() -> None:
        """Between fork and exec: the parent-death signal, which fires when the thread that started
        the child ends (SIGKILL of this process included); it exits if that came first."""
        prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    full = dict(os.environ if env is None else env)
    me = stat(os.getpid())  # with our start time, a later suite tells whether we are gone (orphans.py)
    run_id = f"{os.getpid()}-{me.start if me else 0}-{next(_ids)}-{os.urandom(4).hex()}"
    outer = [x for x in os.environ.get(orphans.RUN_ID_VAR, "").split(":") if x][-(MAX_RUN_IDS - 1):]
    full[orphans.RUN_ID_VAR] = ":".join([*outer, run_id])
    with _lock:  # registered before a sweep can take it for an orphan or reap it
        for pid in [pid for pid, c in _children.items() if c.ended and c.popen.poll() is not None]:
            del _children[pid]
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=full,
                                 cwd=cwd, start_new_session=True, close_fds=True,
                                 preexec_fn=die_with_us if prctl is not None else None, **drop)
        st = stat(popen.pid)
        _children[popen.pid] = _Child(popen, run_id.encode(), st.start if st else 0)
    return popen


def _killpg(popen: subprocess.Popen[bytes], sig: int) -> None:
    # Not yet reaped (a zombie holds its pid), the child's pid names its group and no other.
    if popen.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(popen.pid, sig)


def _of_run(child: _Child) -> Select:
    """The processes of one run: the child, its group and session, each orphan re-parented to us
    (the subreaper) that carries the run's marker, and all below them. An orphan whose environment
    is empty (in execve) is not told yet; still empty KILL_WAIT after the first look (env -i), it is
    not ours."""
    me, root = os.getpid(), child.popen.pid
    reaper = _reaper == (me, True)
    judged: dict[tuple[int, int], bool] = {}
    first: dict[tuple[int, int], float] = {}

    def ours(key: tuple[int, int]) -> bool | None:
        if key not in judged:
            markers = orphans.marked(key[0])
            if markers is not None or time.monotonic() - first.setdefault(key, time.monotonic()) >= KILL_WAIT:
                judged[key] = child.run_id in (markers or ())
        return judged.get(key)

    def select(procs: Mapping[int, Proc]) -> tuple[set[int], bool]:
        cur = procs.get(root)
        # While any process is in the child's group or session, the kernel does not reuse its pid.
        own = cur is None or cur.start == child.start
        seeds, unsure = set(), False
        for pid, p in procs.items():
            if own and root in (pid, p.pgid, p.sid):
                seeds.add(pid)
            elif reaper and p.ppid == me and p.start >= child.start and p.state not in DEAD \
                    and pid not in _children:
                said = ours((pid, p.start))
                seeds.update([pid] if said else [])
                unsure |= said is None
        return below(procs, seeds) - {me}, unsure

    return select


def _sweep(select: Select, sig: int, popens: list[subprocess.Popen[bytes]], since: int, until: float,
           settle: float = KILL_WAIT) -> dict[int, int]:
    """Send ``sig`` to the groups of ``popens`` and, once, to each process ``select`` finds, pass
    after pass, reaping each zombie child of ours signalled or started since ``since`` (never one
    spawn() started: its Popen reaps it); until a pass finds nothing, ``settle`` seconds after the
    last that signalled one (what is left is stuck), or ``until``. Returns pid -> start signalled."""
    me = os.getpid()
    signalled: dict[int, int] = {}
    last_new = time.monotonic()
    while True:
        for popen in popens:
            _killpg(popen, sig)
            popen.poll()
        procs = table()
        found, unsure = select(procs)
        zombies = [pid for pid, p in procs.items() if p.ppid == me and p.state in DEAD
                   and pid not in _children and (p.start >= since or signalled.get(pid) == p.start)]
        with _lock:  # no child is started meanwhile, so a zombie not registered is none of spawn()'s
            for pid in zombies:
                st = stat(pid)
                if pid not in _children and st is not None and st.state in DEAD and st.ppid == me:
                    with contextlib.suppress(ChildProcessError):  # reaped by code that starts no child here
                        os.waitpid(pid, os.WNOHANG)
        new = {pid: procs[pid].start for pid in found
               if procs[pid].state not in DEAD and signalled.get(pid) != procs[pid].start}
        signalled.update((pid, start) for pid, start in new.items() if signal_same(pid, start, sig))
        now = time.monotonic()
        last_new = now if new else last_new
        # An orphan not told yet (in execve) is waited for up to KILL_WAIT more, as ours() judges it.
        if not (found or zombies or unsure) or now >= until + (KILL_WAIT if unsure else 0.0) or (
                now - last_new >= settle and not unsure):
            return signalled
        time.sleep(0 if new else 0.005)


def _childless() -> bool:
    # The subreaper with no child (an exiting child hands its own to us before it leaves the list).
    if _reaper != (os.getpid(), True):
        return False
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children", "rb") as fh:
                if fh.read(64).strip():
                    return False
    except OSError:  # a thread that ended meanwhile, or a kernel without the file: sweep
        return False
    return True


def end(popen: subprocess.Popen[bytes], *, grace: float = TERM_GRACE) -> int | None:
    """End a child that spawn() started and all of its run: SIGTERM to its group, ``grace`` seconds,
    then the sweep. Its exit status, or None if it survived SIGKILL (stuck); within ``grace + KILL_WAIT``."""
    import subprocess
    from contextlib import suppress

    child = _children.get(popen.pid)
    if child is not None and popen.poll() is not None and _childless():
        child = None  # it exited, and nothing of its run is left to sweep
    if grace > 0 and popen.poll() is None:
        _killpg(popen, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=grace)
    if child is not None:
        _sweep(_of_run(child), signal.SIGKILL, [popen], child.start, time.monotonic() + KILL_WAIT)
        st = stat(popen.pid) if popen.poll() is None else None
        if st is not None and st.state == b"R":
            # Killed and runnable: a starved machine has not run its exit yet. Only one that
            # stays asleep (in a wedged driver) is stuck.
            with suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=DYING_WAIT)
    with _lock:
        if popen.poll() is not None:
            _children.pop(popen.pid, None)
        elif child is not None:
            child.ended = True
    return popen.returncode


def end_descendants(grace: float = 0.0) -> int:
    """The final sweep of the CLI or serve: every descendant ended as end() does, after SIGTERM and
    ``grace`` seconds when given. How many it signalled; 0 at once when there is none."""
    if (_reaper[0] != os.getpid() and not _children) or _childless():
        return 0
    me = os.getpid()

    def mine(procs: Mapping[int, Proc]) -> tuple[set[int], bool]:
        return below(procs, [me]) - {me}, False

    popens = [child.popen for child in list(_children.values())]
    termed = _sweep(mine, signal.SIGTERM, popens, 0, time.monotonic() + grace, grace) if grace > 0 else {}
    return len(termed.keys() | _sweep(mine, signal.SIGKILL, popens, 0, time.monotonic() + 1.0).keys())


def run(argv: Sequence[str], *, deadline: float, env: Mapping[str, str] | None = None,
        cwd: str | None = None, max_output: int = MAX_OUTPUT, state: State | None = None,
        key: str | None = None, until: Callable[[bytes], bool] | None = None,
        linger: float = LINGER, user: tuple[int, int] | None = None) -> Completed:
    """Run ``argv`` until it exits or ``deadline`` (time.monotonic()) passes; return within about
    ``TERM_GRACE + KILL_WAIT`` of it whatever the child does, leaving nothing it started but a
    process the kernel will not let die. With ``state`` and ``key``, such a process is remembered,
    and while it exists no child is started under ``key`` (``held_by``). ``until(stdout so far)``,
    cheap and never raising: once true, the child gets at most ``linger`` more seconds to exit."""
    import selectors
    import subprocess  # here: the CLI's final sweep and serve need only the rest of this module

    start = time.monotonic()
    argv = tuple(argv)
    held = state.stuck_child(key) if state is not None and key else None
    if held is not None:
        return Completed(argv, None, stuck=True, held_by=held, elapsed=time.monotonic() - start)
    try:
        proc = spawn(argv, env=env, cwd=cwd, user=user)
    except OSError as exc:
        return Completed(argv, None, spawn_error=childio.spawn_error(exc, argv[0], env, cwd),
                         elapsed=time.monotonic() - start)
    out = childio.Output(proc.stdout.fileno(), proc.stderr.fileno(), max_output)  # type: ignore[union-attr]
    timed_out = answered = False
    stop_at = deadline  # brought forward once until() is met
    exited_at: float | None = None
    sel = selectors.DefaultSelector()
    for fd in (out.out_fd, out.err_fd):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= stop_at:
                timed_out = proc.poll() is None
                if not timed_out:  # it finished before we looked: what it wrote is in the pipes
                    out.drain(sel)
                break
            if proc.poll() is not None:
                exited_at = exited_at or now
                if now - exited_at >= DRAIN_AFTER_EXIT:
                    break  # a grandchild holds the pipe: stop reading, it is killed below
            wait = min(stop_at - now, 0.05 if exited_at is None else DRAIN_AFTER_EXIT)
            for ready, _ in sel.select(timeout=max(wait, 0.0)):
                if (kept := out.read(ready.fd)) < 0:
                    sel.unregister(ready.fd)
                elif until is not None and not answered and ready.fd == out.out_fd and kept \
                        and until(out.stdout()):
                    answered = True
                    stop_at = min(deadline, time.monotonic() + max(linger, 0.0))
        if not timed_out:
            try:
                proc.wait(timeout=max(stop_at - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
        returncode = end(proc, grace=TERM_GRACE if proc.returncode is None else 0.0)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    if returncode is None and state is not None and key:
        state.remember_stuck(key, proc.pid)
    return Completed(argv, returncode, out.stdout(), bytes(out.bufs[out.err_fd]), timed_out=timed_out,
                     stuck=returncode is None, truncated=out.cut[out.out_fd], lingered=answered and timed_out,
                     elapsed=time.monotonic() - start, stderr_truncated=out.cut[out.err_fd])


def signal_name(num: int) -> str:
    """SIGKILL for 9; "signal 99" for a number no signal has."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
