"""Run a child process that may hang, without ever hanging the caller, and leave nothing behind.

What it promises: docs/probes.md, "Containment". How: a run's processes are frozen (SIGSTOP) pass
after pass until a pass finds nothing new, then killed; what was ours is reaped with
``waitpid(pid, WNOHANG)`` on that pid, never a child a Popen object here owns. One in state D (a
wedged driver) is reported ``stuck`` and remembered (``run``'s ``key``). One that left the tree
and dropped the marker is ended only by the final sweep (``end_descendants``); what ends the
children of a SIGKILLed suite is probes/orphans.py.
"""
from __future__ import annotations

import _thread
import itertools
import os
import signal
import time

from probes import childio, orphans

# The margins of a child's end (probes/deadlines.py); probes give run() ``ctx.deadline - deadlines.MARGIN``.
from probes.deadlines import DRAIN_AFTER_EXIT, KILL_WAIT, LINGER, SWEEP_TIME, TERM_GRACE
from probes.pidstat import DEAD, stat
from probes.pidstat import Proc as _Proc
from probes.pidstat import below as _below
from probes.pidstat import signal_each as _signal
from probes.pidstat import table as _table
from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterable, Mapping, Sequence
    from typing import IO, Any, Callable

    from probes.state import State

SWEEP_PASSES = 200  # the freeze-then-kill passes, at most (and SWEEP_TIME)
MAX_OUTPUT = 64 * 1024  # stdout kept, by default (run's max_output)
MAX_STDERR = childio.MAX_STDERR
RUN_ID_VAR = orphans.RUN_ID_VAR
MAX_RUN_IDS = 16  # markers of enclosing runs kept (serve -> CLI -> tool is 2 deep)
PR_SET_CHILD_SUBREAPER = 36


class Completed(Record):
    __slots__ = ("argv", "returncode", "stdout", "stderr", "timed_out", "stuck", "truncated", "spawn_error",
                 "elapsed", "pid", "held_by", "stderr_truncated", "lingered")

    argv: tuple[str, ...]
    returncode: int | None  # None: still there after SIGKILL (stuck) or never started
    stdout: bytes
    stderr: bytes
    timed_out: bool  # not exited at the deadline: a verdict of deadline, never of its output
    stuck: bool  # it survived SIGKILL (uninterruptible sleep)
    truncated: bool  # stdout beyond max_output was discarded (stdout only)
    spawn_error: str | None  # "not found", "permission denied", ...
    elapsed: float
    pid: int | None
    held_by: int | None  # not started: this earlier child is still stuck (see run's key)
    stderr_truncated: bool  # stderr beyond MAX_STDERR was discarded
    lingered: bool  # ``until`` was met but the child did not exit by itself: it was ended

    def __init__(self, argv: tuple[str, ...], returncode: int | None, stdout: bytes = b"",
                 stderr: bytes = b"", timed_out: bool = False, stuck: bool = False, truncated: bool = False,
                 spawn_error: str | None = None, elapsed: float = 0.0, pid: int | None = None,
                 held_by: int | None = None, stderr_truncated: bool = False, lingered: bool = False) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.stuck = stuck
        self.truncated = truncated
        self.spawn_error = spawn_error
        self.elapsed = elapsed
        self.pid = pid
        self.held_by = held_by
        self.stderr_truncated = stderr_truncated
        self.lingered = lingered

    @property
    def signal(self) -> int | None:
        """The signal that killed the child, if one did."""
        if self.returncode is not None and self.returncode < 0:
            return -self.returncode
        return None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


# ---------------------------------------------------------------------------
# Containment: the subreaper, run markers, and the sweeps that end a process tree
# ---------------------------------------------------------------------------

class _Child:
    """A child started here with Popen: only its Popen object ever reaps it."""

    __slots__ = ("ended", "popen", "run_id", "start")

    def __init__(self, popen: subprocess.Popen[bytes], run_id: str, start: int | None) -> None:
        self.popen = popen
        self.run_id = run_id
        self.start = start
        self.ended = False  # end() gave up on it (stuck): polled later, then forgotten


STOPPED = (b"T", b"t")
_lock = _thread.allocate_lock()
_children: dict[int, _Child] = {}  # pid -> child started by spawn() (proc.run, serve's watcher)
_killed: dict[int, int] = {}  # pid -> start time: killed by a sweep, reaped here once it is our zombie
_reaper_pid: int | None = None  # the pid that asked to be the subreaper (a fork child is not one)
_reaper_ok = False
_ids = itertools.count(1)
_blank: dict[int, int] = {}  # pid -> start of a process seen stopped with an empty environment


def subreaper() -> bool:
    """Make this process the child subreaper, once, so a sweep can still find and reap an
    orphaned descendant. False where the kernel refuses (not Linux, or before 3.4): sweeps
    then look for the run marker in every process started since the run began."""
    global _reaper_pid, _reaper_ok
    me = os.getpid()
    if _reaper_pid != me:
        with _lock:
            if _reaper_pid != me:
                _reaper_ok = _prctl_subreaper()
                _reaper_pid = me
    return _reaper_ok


def _prctl_subreaper() -> bool:
    try:
        import ctypes  # ~2 ms, and only once a child is started

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _carries(pid: int, run_id: bytes) -> bool | None:
    """Whether the process's environment has ``run_id`` among its run markers; None when
    it cannot tell yet (an empty environment: the process is in the middle of execve)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return run_id in orphans.markers(data) if data else None


def _marked_env(env: Mapping[str, str] | None) -> tuple[dict[str, str], str]:
    """The child's environment with a new run marker after ours (the enclosing runs')."""
    full = dict(os.environ if env is None else env)
    me = stat(os.getpid())  # with our start time, a later suite tells whether we are gone (orphans.py)
    run_id = f"{os.getpid()}-{me.start if me else 0}-{next(_ids)}-{os.urandom(4).hex()}"
    outer = [x for x in os.environ.get(RUN_ID_VAR, "").split(":") if x][-(MAX_RUN_IDS - 1):]
    full[RUN_ID_VAR] = ":".join([*outer, run_id])
    return full, run_id


# A selector: in a process table, the processes of a run (or all of ours), and those it
# cannot tell yet: pid -> start of each whose environment is empty (in execve, or env -i).
if TYPE_CHECKING:
    Select = Callable[[Mapping[int, _Proc]], "tuple[set[int], dict[int, int]]"]

def _of_run(root: int, child: _Child | None) -> Select:
    """The processes of one run: the child, its group and session, everything below it,
    and whatever carries the run's marker (re-parented to us, or anywhere new when we
    could not become the subreaper), with everything below those."""
    me = os.getpid()
    reaper = subreaper()
    run_id = child.run_id.encode() if child is not None else None
    root_start = child.start if child is not None else None

    def select(table: Mapping[int, _Proc]) -> tuple[set[int], dict[int, int]]:
        cur = table.get(root)
        # A reused pid is not our child; and while any process is still in the child's
        # group or session, the kernel does not reuse its pid.
        own = cur is None or root_start is None or cur.start == root_start
        seeds = set()
        unsure: dict[int, int] = {}
        for pid, p in table.items():
            if pid == me:
                continue
            if own and root in (pid, p.pgid, p.sid):
                seeds.add(pid)
                continue
            if run_id is None or root_start is None or p.start < root_start or p.state in DEAD:
                continue  # older than the child: not of this run
            # Re-parented to us (or, without the subreaper, anywhere).
            if (p.ppid == me or not reaper) and pid not in _children:
                carries = _carries(pid, run_id)
                if carries:
                    seeds.add(pid)
                elif carries is None and _blank.get(pid) != p.start:
                    unsure[pid] = p.start
        for pid in [pid for pid in _blank if pid not in table]:
            _blank.pop(pid, None)
        found = _below(table, seeds)
        found.discard(me)
        return found - ({*_children} - {root}), unsure

    return select


def _of_mine(table: Mapping[int, _Proc]) -> tuple[set[int], dict[int, int]]:
    me = os.getpid()
    return _below(table, [me]) - {me}, {}


def _settled(table: Mapping[int, _Proc], found: set[int], dead: set[tuple[int, int]]) -> bool:
    """Whether no process of the run can have forked unseen by this pass.

    /proc is read one process at a time after it is listed, so a process that forks and
    dies while the table is read shows as dead, and its child was listed by no one: the
    pass is not settled while a process of the run (found, or a child of ours or of one
    found) is newly seen dead (``dead``: pid and start of those seen, updated). Nor while a
    process found is still running: a SIGSTOP that arrives during fork() stops the parent
    only once the child exists. A process in uninterruptible sleep stops on its way back to
    user space, so it counts as stopped.
    """
    me = os.getpid()
    calm = True
    for pid, p in table.items():
        if p.state in DEAD:
            if (pid in found or p.ppid == me or p.ppid in found) and (pid, p.start) not in dead:
                dead.add((pid, p.start))
                calm = False
        elif pid in found and p.state not in STOPPED and p.state != b"D":
            calm = False
    return calm


def _freeze_and_kill(select: Select, budget: float,
                     seen: dict[int, int] | None = None) -> tuple[dict[int, int], dict[int, _Proc]]:
    """SIGSTOP what ``select`` finds, pass after pass until the run is settled (see _settled)
    in two passes in a row (one, when it has nothing alive), then SIGKILL it all. A stopped
    process forks no more and its children stay below it (or come to us, the subreaper,
    with the run's marker), so then nothing of the run is left to find.

    A process that ``select`` cannot tell yet (its environment is empty: it is in the
    middle of execve) is stopped too, which it does once execve is done; then its new
    environment says whether it is ours. One that is still empty (env -i) is let go on
    (SIGCONT) and not stopped again. Bounded by ``budget`` seconds of this thread's CPU time,
    ``budget`` seconds of wall time since the last pass that found a process to stop, and
    SWEEP_PASSES. Not by wall time from the start: a busy machine keeps the sweeper waiting
    between passes, and what a storm forked meanwhile (found by the next pass) outlived
    the run.
    ``seen``: pid -> start of processes killed before (not new; updated). Returns pid ->
    start of those killed now, and the last process table read.
    """
    limit = time.monotonic() + budget
    cpu_limit = time.thread_time() + budget
    seen = {} if seen is None else seen
    killed: dict[int, int] = {}
    checking: dict[int, int] = {}  # stopped to read their environment once execve is done
    dead: set[tuple[int, int]] = set()
    settled_before = False
    table: dict[int, _Proc] = {}
    try:
        for _ in range(SWEEP_PASSES):
            with _lock:  # no zombie of ours is reaped, by another thread, while /proc is read
                table = _table()
            found, unsure = select(table)
            new = {pid: table[pid].start for pid in found
                   if table[pid].state not in DEAD and seen.get(pid) != table[pid].start}
            for pid, start in list(checking.items()):
                p = table.get(pid)
                if p is None or p.start != start or p.state in DEAD or pid in found:
                    del checking[pid]  # gone, or ours after all (stopped: killed below)
                elif pid not in unsure or p.state in STOPPED:
                    # An environment without our marker, or still none once execve is
                    # done (env -i): not ours. Let it go on.
                    if pid in unsure:
                        _blank[pid] = start
                    del checking[pid]
                    _signal([pid], signal.SIGCONT)
            probe = {}
            for pid, start in unsure.items():
                if pid in checking:
                    continue
                if table[pid].state in STOPPED:
                    _blank[pid] = start  # stopped by someone else, so not in execve: not ours
                else:
                    probe[pid] = start
            _signal(probe, signal.SIGSTOP)
            checking.update(probe)
            if new:
                _signal(new, signal.SIGSTOP)
                killed.update(new)
                seen.update(new)
            settled = _settled(table, found, dead) and not new
            if settled and not checking and (settled_before or not _alive(table, found)):
                break
            settled_before = settled
            if new or probe:
                limit = time.monotonic() + budget  # found more: the wait before this pass did not count
            if time.monotonic() >= limit or time.thread_time() >= cpu_limit:
                break
            if not new:
                time.sleep(0.002)  # for an execve to end
    finally:
        _signal(killed, signal.SIGKILL)
        _signal([pid for pid in checking if pid not in killed], signal.SIGCONT)
    return killed, table


def _childless() -> bool:
    """Whether this process, the subreaper, has no child at all, running or a zombie: then
    nothing any run of ours started is left anywhere (an orphan of ours is re-parented to us),
    and a sweep would read the whole process table to find nothing. Each thread's children are
    in /proc/self/task/<tid>/children; only an empty list is trusted (one read while a child
    exits can skip another child, an empty one cannot hide one: an exiting process hands its
    children to us before it leaves our list)."""
    if not _reaper_ok or _reaper_pid != os.getpid():
        return False
    try:
        for tid in os.listdir("/proc/self/task"):
            fd = os.open(f"/proc/self/task/{tid}/children", os.O_RDONLY)
            try:
                if os.read(fd, 64).strip():
                    return False
            finally:
                os.close(fd)
    except OSError:  # a thread that ended meanwhile, or a kernel without the file: sweep
        return False
    return True


def _alive(table: Mapping[int, _Proc], pids: Iterable[int]) -> bool:
    return any(table[pid].state not in DEAD for pid in pids if pid in table)


def _reap(focus: Iterable[int] = ()) -> set[int]:
    """Reap what the sweeps killed and is now our zombie (never a child that spawn()
    started: its Popen object reaps it). Returns those of ``focus`` still to go."""
    me = os.getpid()
    focus = set(focus)
    pending: set[int] = set()
    with _lock:
        for pid, start in list(_killed.items()):
            st = stat(pid)
            if st is None or st.start != start or pid in _children:
                del _killed[pid]  # gone, its pid reused, or reaped by its Popen
                continue
            if st.state in DEAD and st.ppid == me:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    del _killed[pid]
                    continue
            if pid in focus:
                pending.add(pid)  # still dying, or the zombie of a parent that is dying too
    return pending


def _prune() -> None:
    """Forget children that end() gave up on once their Popen has reaped them."""
    for pid, child in list(_children.items()):
        if child.ended and child.popen.poll() is not None:
            _children.pop(pid, None)


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
          stdout: int | IO[Any] | None = -1, stderr: int | IO[Any] | None = -1,
          user: tuple[int, int] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` as proc.run does (own session, stdin from /dev/null, a new run marker
    in its environment) and register it; end it with end(). stdout/stderr: as Popen's
    (default: a pipe each). ``user``: (uid, gid) the child runs as, with no supplementary
    group, when it is not ours (only root may). Raises OSError when it cannot be started."""
    import subprocess

    drop: dict[str, Any] = {}
    if user is not None and user != (os.geteuid(), os.getegid()):
        drop = {"user": user[0], "group": user[1], "extra_groups": []}

    subreaper()
    orphans.sweep_once()  # what a killed suite left (probes/orphans.py)
    full, run_id = _marked_env(env)
    with _lock:  # no sweep may take this child's exit status before it is registered
        _prune()
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=full,
                                 cwd=cwd, start_new_session=True, close_fds=True, **drop)
        st = stat(popen.pid)
        _children[popen.pid] = _Child(popen, run_id, st.start if st is not None else None)
    return popen


def end(popen: subprocess.Popen[bytes], *, grace: float = TERM_GRACE) -> int | None:
    """End a child that spawn() started and everything it started; returns its exit status,
    or None if it survived SIGKILL (uninterruptible sleep: stuck).

    A child still running gets SIGTERM (with all of its run's processes) and ``grace``
    seconds to exit; then the run's processes are frozen and killed, and what we killed
    is reaped. Returns within about ``grace + KILL_WAIT`` seconds (the sweep, at most
    SWEEP_TIME, is part of KILL_WAIT).
    """
    import subprocess

    child = _children.get(popen.pid)
    if popen.poll() is not None and (child is None or _childless()):
        # Ended already (its pid may be someone else's by now), and nothing of it is left.
        with _lock:
            _children.pop(popen.pid, None)
        return popen.returncode
    select = _of_run(popen.pid, child)
    t0 = time.monotonic()
    termed: dict[int, int] = {}
    if grace > 0 and popen.poll() is None:
        table = _table()
        termed = {pid: table[pid].start for pid in select(table)[0] if table[pid].state not in DEAD}
        _signal(termed, signal.SIGTERM)
        try:
            popen.wait(timeout=max(t0 + grace - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            pass
    # The sweep comes out of KILL_WAIT, so the bound stays grace + KILL_WAIT.
    limit = time.monotonic() + KILL_WAIT
    killed, table = _freeze_and_kill(select, min(SWEEP_TIME, KILL_WAIT))
    ours = {**termed, **killed}
    with _lock:
        _killed.update(ours)
    # Orphans of the run that died before the sweep (a daemon's middle process, a storm's
    # parent) are our zombies now: started since the child, and not a Popen's own child.
    if child is not None and child.start is not None:
        _reap_orphans(table, since=child.start)
    while True:
        pending = _reap(ours)
        if (popen.poll() is not None and not pending) or time.monotonic() >= limit:
            break
        time.sleep(0.005)
    with _lock:
        if popen.returncode is not None:
            _children.pop(popen.pid, None)
        elif child is not None:
            child.ended = True  # stuck: its Popen reaps it if the kernel ever lets it die
    return popen.returncode


def end_descendants(grace: float = 0.0, *, within: float = 1.0) -> int:
    """End every descendant of this process: SIGTERM and ``grace`` seconds first when
    ``grace`` > 0, then freeze-and-kill sweeps repeated until one finds nothing (at most
    ``within`` seconds in all, plus ``grace``), reaping each killed process that is our
    zombie and was not started by spawn() (its Popen object reaps that one). For the
    final sweep of a process that exits (the CLI) or stops (serve), where every child is
    started with spawn(): it reaps any other zombie child too. Returns how many processes
    it signalled. A process that never started a child here and is not the subreaper has
    none of the suite's: it returns at once.
    """
    if (_reaper_pid != os.getpid() and not _children) or _childless():
        return 0
    ended: set[int] = set()
    if grace > 0:
        table = _table()
        ended = {pid for pid in _of_mine(table)[0] if table[pid].state not in DEAD}
        _signal(ended, signal.SIGTERM)
        limit = time.monotonic() + grace
        while time.monotonic() < limit:
            table = _table()
            if not any(table[pid].state not in DEAD for pid in _of_mine(table)[0]):
                break
            _reap_orphans()
            time.sleep(0.01)
    limit = time.monotonic() + within
    seen: dict[int, int] = {}
    while True:
        killed, _ = _freeze_and_kill(_of_mine, min(SWEEP_TIME, max(limit - time.monotonic(), 0.0)), seen)
        ended.update(killed)
        with _lock:
            _killed.update(killed)
        # A process in uninterruptible sleep stays: wait KILL_WAIT for it, not ``within``.
        wait_until = min(limit, time.monotonic() + KILL_WAIT)
        while True:
            _reap_orphans()
            if not _reap(seen) or time.monotonic() >= wait_until:
                break
            time.sleep(0.005)
        if not killed or time.monotonic() >= limit:
            return len(ended)


def _reap_orphans(table: Mapping[int, _Proc] | None = None, since: int | None = None) -> None:
    """Reap each zombie child of ours that spawn() did not start (an orphan that was
    re-parented to us and died), of those started at or after ``since`` when given."""
    me = os.getpid()
    with _lock:
        for pid, p in (_table() if table is None else table).items():
            if (p.ppid == me and p.state in DEAD and pid not in _children
                    and (since is None or p.start >= since)):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                _killed.pop(pid, None)


def _read(proc: subprocess.Popen[bytes], out: childio.Output, deadline: float,
          until: Callable[[bytes], bool] | None, linger: float) -> tuple[bool, bool, float]:
    """Read the child's output until it exits (and its pipes end, or DRAIN_AFTER_EXIT after its
    exit: a grandchild may hold them) or the deadline passes, the deadline brought forward once
    ``until`` is met. Returns (timed_out, answered, the deadline it kept)."""
    import selectors

    timed_out = False
    answered = False  # until() was met
    stop_at = deadline  # the deadline, or earlier once until() is met
    sel = selectors.DefaultSelector()
    for fd in (out.out_fd, out.err_fd):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= stop_at:
                timed_out = proc.poll() is None
                if not timed_out:
                    # It finished before we looked: what it wrote is in the pipes, all of it.
                    out.drain(sel)
                break
            if proc.poll() is not None:
                exited_at = exited_at or now
                if now - exited_at >= DRAIN_AFTER_EXIT:
                    break  # a grandchild holds the pipe: stop reading, it is killed below
            wait = min(stop_at - now, 0.05 if exited_at is None else DRAIN_AFTER_EXIT)
            for ready, _ in sel.select(timeout=max(wait, 0.0)):
                if out.read(ready.fd) < 0:
                    sel.unregister(ready.fd)
                elif until is not None and not answered and ready.fd == out.out_fd and out.kept \
                        and until(out.stdout()):
                    answered = True
                    stop_at = min(deadline, time.monotonic() + max(linger, 0.0))
    finally:
        sel.close()
    return timed_out, answered, stop_at


def run(argv: Sequence[str], *, deadline: float, env: Mapping[str, str] | None = None,
        cwd: str | None = None, max_output: int = MAX_OUTPUT, state: State | None = None,
        key: str | None = None, until: Callable[[bytes], bool] | None = None,
        linger: float = LINGER, user: tuple[int, int] | None = None) -> Completed:
    """Run ``argv`` until it exits or ``deadline`` (a time.monotonic() value) passes.

    Returns within about ``TERM_GRACE + KILL_WAIT`` seconds of the deadline, whatever the child
    does (a fork storm included), and leaves nothing it started behind but a process the kernel
    will not let die. With ``state`` and ``key``, a child that survives SIGKILL is remembered,
    and while it exists no new one is started under the same key: the result is ``stuck`` with
    ``held_by`` set, at once.

    ``timed_out``: the child had not exited when the deadline passed; what it wrote so far is
    partial and is no verdict (every judge reads ``timed_out`` first). A child that had exited
    by then is read to the end of what it wrote, however late this process got to look.

    Output: the first ``max_output`` bytes of stdout (``truncated``: more was discarded) and the
    first ``MAX_STDERR`` of stderr (``stderr_truncated``), so a child that floods stderr still
    gives a valid, untruncated stdout.

    ``until``: called with the stdout read so far whenever more arrives; once it returns
    true (the answer is complete, e.g. a whole result line arrived) the child gets at most
    ``linger`` more seconds (never past ``deadline``) to exit by itself. If it has not, it
    is ended as at the deadline, and the result has ``timed_out`` and ``lingered`` set:
    the answer came, but the process did not go. ``until`` must be cheap and must not raise.

    ``user``: (uid, gid) to run the child as (see spawn).
    """
    # Imported here: what needs only this module's constants, sweeps or signal_name() (the
    # CLI's final sweep, serve) does not pay for subprocess + selectors (~6 ms of start-up).
    import subprocess

    start = time.monotonic()
    argv = tuple(argv)
    guard = state if state is not None and key else None
    if guard is not None:
        held = guard.stuck_child(key)  # type: ignore[arg-type]
        if held is not None:
            return Completed(argv, None, stuck=True, held_by=held, elapsed=time.monotonic() - start)
    try:
        proc = spawn(argv, env=env, cwd=cwd, user=user)
    except OSError as exc:
        return Completed(argv, None, spawn_error=childio.spawn_error(exc, argv[0], env, cwd),
                         elapsed=time.monotonic() - start)

    out = childio.Output(proc.stdout.fileno(), proc.stderr.fileno(), max_output)  # type: ignore[union-attr]
    timed_out, answered, stop_at = _read(proc, out, deadline, until, linger)

    try:
        if not timed_out:
            try:
                proc.wait(timeout=max(stop_at - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        # SIGTERM first if it is still running; then its group, its session, everything
        # below it and everything re-parented to us with its marker is killed.
        returncode = end(proc, grace=TERM_GRACE if proc.returncode is None else 0.0)
        for stream in (proc.stdout, proc.stderr):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
    if returncode is None and guard is not None:
        guard.remember_stuck(key, proc.pid)  # type: ignore[arg-type]
    return Completed(argv, returncode, out.stdout(), bytes(out.bufs[out.err_fd]), timed_out=timed_out,
                     stuck=returncode is None, truncated=out.cut[out.out_fd],
                     elapsed=time.monotonic() - start, pid=proc.pid, stderr_truncated=out.cut[out.err_fd],
                     lingered=answered and timed_out)


def signal_name(num: int) -> str:
    """SIGKILL for 9; "signal 99" for a number no signal has (for messages about a child)."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


