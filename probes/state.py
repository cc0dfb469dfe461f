"""The state directory: cached results, locks and the sticky CUDA-fatal latch.

Where it is and what is refused: ``HEALTHCHECK_STATE_DIR`` in docs/probes.md. It is a real
directory owned by us, reached only through directories nobody but root or us can change, 0700
with files 0600 whatever the umask; when none can be used, caching is off and the run says so.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time

from probes import pidstat
from probes.record import Record
from probes.untrusted import Refused, load_json, open_trusted_dir, read_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LATCH = "latch.json"
MARK = "latch@"  # the empty file that stands for the latch when nothing else can be written
MAX_FILE = 1 << 20  # no state file is anywhere near this size
KEPT_WITHOUT_DETAILS = "its details could not be stored (the state dir was full)"
SCRATCH = "scratch"  # runs' private directories (State.scratch)
MAX_SCRATCH = 256  # entries of the scratch directory looked at for a killed run's leftovers
MAX_BESIDE = 4096  # entries of a shared directory looked through for our state dir (beside)


def candidates() -> list[str]:
    """The default locations, in the order they are tried."""
    uid = os.getuid()
    found = ["/run/healthcheck"]
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/") and os.path.isdir(runtime):
        found.append(os.path.join(runtime, "healthcheck"))
    tmpdir = os.environ.get("TMPDIR", "")
    try:
        if tmpdir.startswith("/") and stat.S_ISDIR(os.lstat(tmpdir).st_mode):
            found.append(os.path.join(tmpdir, f"healthcheck-{uid}"))
    except OSError:
        pass
    found += [f"/tmp/healthcheck-{uid}", f"/dev/shm/healthcheck-{uid}"]  # noqa: S108
    return list(dict.fromkeys(os.path.normpath(p) for p in found))


def beside(plain: str) -> str | None:
    """Our state dir next to ``plain``, a name in a shared directory that another user took first:
    ``<plain>.<time><random>``, which nobody can take before us, found again by its prefix and owner.
    The oldest wins, so runs that made one at once agree. None when there is none and none can be
    made, or too many entries to look through (a new directory on every run would pile up)."""
    ours = _ours_beside(plain)
    if ours is None:
        return None
    if not ours:
        made = f"{plain}.{time.time_ns():016x}{os.urandom(8).hex()}"
        try:
            os.mkdir(made, 0o700)
            _private(made)
        except OSError:
            return None
        ours = _ours_beside(plain) or [made]
        if ours[0] != made:
            try:
                os.rmdir(made)  # another run's came first; ours is still empty
            except OSError:
                pass
    return ours[0]


def _ours_beside(plain: str) -> list[str] | None:
    """Our private directories named ``<plain>.*``, oldest first; None when they cannot be listed
    or the directory holds more than MAX_BESIDE entries."""
    parent, prefix = os.path.split(plain)
    found = []
    try:
        with os.scandir(parent) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_BESIDE:
                    return None
                try:
                    st = entry.stat(follow_symlinks=False) if entry.name.startswith(prefix + ".") else None
                except OSError:
                    continue
                if st and (st.st_uid, st.st_mode & 0o177777) == (os.geteuid(), stat.S_IFDIR | 0o700):
                    found.append(entry.path)
    except OSError:
        return None
    return sorted(found)


def _usable(path: str) -> str | None:
    """Create ``path`` (0700) if needed; return why it cannot be used, or None."""
    try:
        os.mkdir(path, 0o700)
        _private(path)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {path}: {os.strerror(exc.errno or 0)}"
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a directory (a symlink or file is refused)"
        fd = open_trusted_dir(path, (0, os.geteuid()))
    except Refused as exc:  # it names the directory or link that may not be trusted
        return str(exc)
    except OSError as exc:
        return f"cannot open {path}: {os.strerror(exc.errno or 0)}"
    try:
        opened = os.fstat(fd)
    finally:
        os.close(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        return f"{path} changed while it was checked"
    if opened.st_uid != os.geteuid():
        return f"{path} belongs to uid {opened.st_uid}, not to us"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable"
    return None


def _private(path: str) -> None:
    """Make the directory we just created 0700 whatever the umask took away, never through a link."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)  # fchmod() refuses an O_PATH descriptor
    except OSError:
        pass  # no /proc: judged as it is
    finally:
        os.close(fd)


def process_start_time(pid: int) -> str | None:
    """A live process's start time (clock ticks since boot; tells a reused pid apart),
    or None if it is gone or a zombie."""
    st = pidstat.stat(pid)
    return None if st is None or st.state == b"Z" else str(st.start)


class Life(Record):
    """This container's life, as every uid sees it (even with ``/proc`` mounted ``hidepid=2``):
    ``ident`` is the boot id, our PID namespace's inode and the time ``/proc`` was mounted (which
    tells two lives apart when the kernel reuses the inode); ``pid1``: PID 1's start, if seen."""

    boot: str
    ident: str
    pid1: str | None


_life: list[Life] = []  # computed once per process: none of it changes while the process lives


def life() -> Life:
    if not _life:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
                boot = fh.read().decode().strip()
        except OSError:
            boot = "?"
        try:
            ns = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
            ns = ns[ns.index("[") + 1:ns.index("]")]
        except (OSError, ValueError):
            ns = "?"
        try:
            mounted = str(os.stat("/proc").st_mtime_ns)
        except OSError:
            mounted = "?"
        st = pidstat.stat(1)
        _life.append(Life(boot, f"{boot}:ns{ns}.{mounted}", None if st is None else str(st.start)))
    return _life[0]


def life_identity() -> str:
    return life().ident


def same_life(ident: Any, pid1: Any) -> bool:
    """Whether a latch (or a record) written with ``ident`` and ``pid1`` is of this container's life.
    An identity of the earlier form, ``<boot id>:<PID 1's start time>``, is judged by PID 1's start
    time where PID 1 can be seen, held where it cannot (a latch is never dropped for want of
    evidence); ``<boot id>:?`` proves nothing."""
    now = life()
    if not isinstance(ident, str):
        return False
    if ident == now.ident:
        return not isinstance(pid1, str) or now.pid1 is None or pid1 == now.pid1
    boot, _, start = ident.rpartition(":")
    return boot == now.boot and start.isdigit() and (now.pid1 is None or start == now.pid1)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Lock:
    """A lock file's descriptor, held until the ``with`` block ends; ``None`` when not had."""

    def __init__(self, fd: int | None, unusable: str | None = None) -> None:
        self._fd = fd
        self.unusable = unusable  # why the lock file could not be had at all (nobody holds it)

    def __enter__(self) -> bool:
        return self._fd is not None

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


class State:
    """Access to the state directory; every method degrades to a no-op when it is off."""

    def __init__(self, path: str | None, disabled_reason: str | None = None):
        self.path = path
        self.disabled_reason = disabled_reason
        self.problem: str | None = None  # why the last write failed

    @classmethod
    def open(cls, path: str | None) -> State:
        """The state dir at ``path``, else the first default location that can be used; off
        (with every location's reason) when none can."""
        reasons = []
        for where in [path] if path else candidates():
            why = _usable(where)
            # /tmp, /dev/shm, $TMPDIR: another user can take the plain name before us
            if why is not None and not path and os.path.basename(where) == f"healthcheck-{os.getuid()}" \
                    and os.path.lexists(where):
                mine = beside(where)
                if mine is not None and _usable(mine) is None:
                    return cls(mine)
                why += "; none of ours beside it"
            if why is None:
                return cls(where)
            reasons.append(why)
        return cls(None, reasons[0] if len(reasons) == 1 else f"no writable state dir ({'; '.join(reasons)})")

    @classmethod
    def off(cls, reason: str) -> State:
        return cls(None, reason)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _file(self, name: str) -> str:
        assert self.path is not None and "/" not in name
        return os.path.join(self.path, name)

    def read_json(self, name: str) -> dict[str, Any] | None:
        """The stored object, or None when absent, unreadable or corrupt (bounded nesting, finite numbers)."""
        if not self.enabled:
            return None
        try:
            data = load_json(read_regular(self._file(name), MAX_FILE)[0])
        except (Refused, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_json(self, name: str, data: dict[str, Any]) -> bool:
        """Atomically replace ``name``; False, the reason in ``problem``, when it cannot."""
        if not self.enabled:
            self.problem = f"state dir off: {self.disabled_reason}"
            return False
        # One temporary file per writing thread: two writers sharing one would tear it.
        tmp = self._file(f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            import json  # reading goes through probes.untrusted; only writers need this

            with os.fdopen(fd, "w") as fh:
                os.fchmod(fd, 0o600)  # whatever the umask took away
                json.dump(data, fh, separators=(",", ":"))
            os.replace(tmp, self._file(name))
            return True
        except (OSError, TypeError, ValueError) as exc:
            _unlink(tmp)
            self.problem = os.strerror(exc.errno or 0) if isinstance(exc, OSError) else type(exc).__name__
            return False

    def remove(self, name: str) -> None:
        if self.enabled:
            _unlink(self._file(name))

    def _open_lock(self, name: str) -> int | None:
        path = self._file(name)
        for _ in (1, 2):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except PermissionError as exc:
                self.problem = f"cannot open {name}: {os.strerror(exc.errno or 0)}"
                # Left unreadable by an earlier run's umask: the directory is ours and private.
                try:
                    os.chmod(path, 0o600)
                except OSError:
                    return None
                continue
            except OSError as exc:  # a full disk (no inode left for it), a read-only remount
                self.problem = f"cannot create {name}: {os.strerror(exc.errno or 0)}"
                return None
            try:
                os.fchmod(fd, 0o600)
            except OSError:
                pass
            return fd
        return None

    def lock(self, name: str, deadline: float) -> Lock:
        """``with state.lock(name, deadline) as held``: an exclusive lock, held until the block
        ends; ``held`` is False if it was not had by ``deadline`` (a time.monotonic() value)
        or when the state dir is off."""
        if not self.enabled:
            return Lock(None, f"state dir off: {self.disabled_reason}")
        fd = self._open_lock(name)
        if fd is None:
            return Lock(None, self.problem or "the lock file cannot be opened")
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return Lock(fd)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        os.close(fd)
        return Lock(None)

    def scratch(self, what: str) -> str | None:
        """A new private directory for files of this run (a kernel's connection file, the ssh
        client's known hosts), ``scratch/<what>-<pid>-<start>-<random>`` in the state dir, never in
        /tmp; None when there is none. The caller removes it (``drop_scratch``); what a killed run
        left is removed by the next call, its pid and start naming a process that is gone."""
        if not self.enabled:
            return None
        base = self._file(SCRATCH)
        try:
            os.mkdir(base, 0o700)
            _private(base)
        except FileExistsError:
            pass
        except OSError:
            return None
        try:
            st = os.lstat(base)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                return None
            with os.scandir(base) as entries:
                for i, entry in enumerate(entries):
                    parts = entry.name.rsplit("-", 3)
                    if i >= MAX_SCRATCH:
                        break
                    if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
                        left = pidstat.stat(int(parts[1]))
                        if left is None or str(left.start) != parts[2] or left.state in pidstat.DEAD:
                            drop_scratch(entry.path)
            me = pidstat.stat(os.getpid())
            path = os.path.join(base, f"{what}-{os.getpid()}-{me.start if me else 0}-{os.urandom(4).hex()}")
            os.mkdir(path, 0o700)
            _private(path)
        except OSError:
            return None
        return path

    def latch(self) -> dict[str, Any] | None:
        """The latch in force for this container life (a fatal CUDA error, or a critical Xid seen by
        serve), or None. A stale one is cleared."""
        data = self.read_json(LATCH)
        if data is not None:
            if same_life(data.get("identity"), data.get("pid1")):
                return data
            self.remove(LATCH)
        if not self.enabled:
            return None
        assert self.path is not None
        try:  # the empty file that stands for the latch (see set_latch); stale ones are removed
            names = [n for n in os.listdir(self.path) if n.startswith(MARK)]
        except OSError:
            return None
        found = None
        for name in names:
            parts = name[len(MARK):].split("@")
            if len(parts) == 4 and same_life(parts[0], None if parts[1] == "?" else parts[1]):
                try:
                    since = os.lstat(self._file(name)).st_mtime
                except OSError:
                    continue
                found = {"source": parts[2], "code": parts[3] or None, "time": since,
                         "reason": f"a fatal error latched the container; {KEPT_WITHOUT_DETAILS}"}
            else:
                self.remove(name)
        return found

    # A child that survived SIGKILL sits in uninterruptible sleep on a wedged driver. Starting
    # another on every probe would pile them up: remember it while it exists.
    def stuck_child(self, key: str) -> int | None:
        """The pid of an earlier ``key`` child that is still stuck, or None (a stale entry is cleared)."""
        name = f"stuck-{key}.json"
        data = self.read_json(name)
        if data is None:
            return None
        pid = data.get("pid")
        if (isinstance(pid, int) and same_life(data.get("identity"), data.get("pid1"))
                and data.get("start") == process_start_time(pid)):
            return pid
        self.remove(name)
        return None

    def remember_stuck(self, key: str, pid: int) -> None:
        self.write_json(f"stuck-{key}.json", {"pid": pid, "start": process_start_time(pid),
                                               "time": time.time(), "identity": life_identity(),
                                               "pid1": life().pid1})

    def set_latch(self, source: str, reason: str, code: str | None = None) -> bool:
        """Latch unhealthy: ``source`` (the probe, or "xid"), the message, and its reason code.
        A file system too full for ``latch.json`` usually still has an inode for an empty file,
        whose name keeps what the latch needs: ``latch@<identity>@<pid 1>@<source>@<code>``.
        False, with the reason in ``problem``, when not even that could be written."""
        now = life()
        data = {"source": source, "reason": reason, "time": time.time(), "identity": now.ident,
                "pid1": now.pid1, **({"code": code} if code else {})}
        if self.write_json(LATCH, data):
            return True
        if not self.enabled:
            return False
        why = self.problem
        # No separator, slash or anything outside [A-Za-z0-9._:-] in the file name's parts.
        name = MARK + "@".join("".join(ch if ch.isascii() and (ch.isalnum() or ch in "._:-") else "_"
                                       for ch in part)[:80] for part in (now.ident, now.pid1 or "?", source,
                                                                         code or ""))
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(self._file(name), flags, 0o600))
        except OSError as exc:
            self.problem = f"{why}; not even an empty file: {os.strerror(exc.errno or 0)}"
            return False
        return True


def drop_scratch(path: str | None) -> None:
    """Remove a directory ``State.scratch`` made, never following a link inside it."""
    if path:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
