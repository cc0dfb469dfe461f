"""The state directory: cached results, locks and the sticky CUDA-fatal latch, private and reached only
through directories nobody but root or us can change, or off (``HEALTHCHECK_STATE_DIR``, docs/probes.md)."""

from __future__ import annotations

import errno
import fcntl
import functools
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
MAX_BESIDE = 4096  # entries of a shared directory looked through for our state dir (beside)


def candidates() -> list[str]:
    uid = os.getuid()
    found = ["/run/healthcheck"]
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/") and os.path.isdir(runtime):
        found.append(os.path.join(runtime, "healthcheck"))
    tmpdir = os.environ.get("TMPDIR", "")
    if tmpdir.startswith("/") and os.path.isdir(tmpdir) and not os.path.islink(tmpdir):
        found.append(os.path.join(tmpdir, f"healthcheck-{uid}"))
    found += [f"/tmp/healthcheck-{uid}", f"/dev/shm/healthcheck-{uid}"]  # noqa: S108
    return list(dict.fromkeys(os.path.normpath(p) for p in found))


def beside(plain: str) -> str | None:
    """Our state dir beside ``plain``, a name another user took first: ``<plain>.<time><random>``, the
    oldest of ours winning so that runs making one at once agree; None past MAX_BESIDE entries."""
    ours = _ours_beside(plain)
    if ours == []:
        made = f"{plain}.{time.time_ns():016x}{os.urandom(8).hex()}"
        try:
            _mkdir_private(made)
        except OSError:
            return None
        ours = _ours_beside(plain) or [made]
        if ours[0] != made:
            _remove(made, os.rmdir)  # another run's came first; ours is still empty
    return ours[0] if ours else None


def _ours_beside(plain: str) -> list[str] | None:
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
    """Why ``path`` (made if needed) cannot be used, or None."""
    try:
        _mkdir_private(path)
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
    opened = os.fstat(fd)
    os.close(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        return f"{path} changed while it was checked"
    if opened.st_uid != os.geteuid():
        return f"{path} belongs to uid {opened.st_uid}, not to us"
    return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"


def _mkdir_private(path: str) -> None:
    """Make the directory, 0700 whatever the umask took away, never through a link."""
    os.mkdir(path, 0o700)
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)  # fchmod() refuses an O_PATH descriptor
    except OSError:
        pass  # no /proc: judged as it is
    finally:
        os.close(fd)


def _remove(path: str, how: Any = os.unlink) -> None:
    try:
        how(path)
    except OSError:
        pass


def process_start_time(pid: int) -> str | None:
    st = pidstat.stat(pid)
    return None if st is None or st.state == b"Z" else str(st.start)


class Life(Record):
    """This container's life, as every uid sees it (even under ``hidepid=2``): ``ident`` is the boot
    id, our PID namespace's inode and when ``/proc`` was mounted (two lives apart when the inode is
    reused); ``pid1``: PID 1's start, if seen."""

    boot: str
    ident: str
    pid1: str | None


@functools.cache  # none of it changes while the process lives
def life() -> Life:
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
    return Life(boot, f"{boot}:ns{ns}.{mounted}", process_start_time(1))


def life_identity() -> str:
    return life().ident


def same_life(ident: Any, pid1: Any) -> bool:
    """Whether what was written with ``ident`` and ``pid1`` is of this container's life. The earlier
    form ``<boot id>:<PID 1's start>`` holds where PID 1 cannot be seen (a latch is never dropped for
    want of evidence); ``<boot id>:?`` proves nothing."""
    now = life()
    if not isinstance(ident, str):
        return False
    if ident == now.ident:
        return not isinstance(pid1, str) or now.pid1 is None or pid1 == now.pid1
    boot, _, start = ident.rpartition(":")
    return boot == now.boot and start.isdigit() and (now.pid1 is None or start == now.pid1)


class Lock(Record):
    fd: int | None
    unusable: str | None = None  # why the lock file could not be had at all (nobody holds it)

    def __enter__(self) -> bool:
        return self.fd is not None

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None


class State(Record):  # the state directory; every method degrades to a no-op when it is off
    path: str | None
    disabled_reason: str | None = None
    problem: str | None = None  # why the last write failed

    @classmethod
    def open(cls, path: str | None) -> State:
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
        if not self.enabled:
            return None
        try:
            data = load_json(read_regular(self._file(name), 1 << 20)[0])  # none is near 1 MiB
        except (Refused, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_json(self, name: str, data: dict[str, Any]) -> bool:
        """False, the reason in ``problem``, when it cannot."""
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
            _remove(tmp)
            self.problem = os.strerror(exc.errno or 0) if isinstance(exc, OSError) else type(exc).__name__
            return False

    def remove(self, name: str) -> None:
        if self.enabled:
            _remove(self._file(name))

    def lock(self, name: str, deadline: float) -> Lock:
        """``with state.lock(name, deadline) as held``; held is False when not had by ``deadline``."""
        if not self.enabled:
            return Lock(None, f"state dir off: {self.disabled_reason}")
        path, flags = self._file(name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except PermissionError:  # left unreadable by an earlier run's umask: the directory is ours
            try:
                os.chmod(path, 0o600)
                fd = os.open(path, flags, 0o600)
            except OSError as exc:
                return Lock(None, f"cannot open {name}: {os.strerror(exc.errno or 0)}")
        except OSError as exc:  # a full disk (no inode left for it), a read-only remount
            return Lock(None, f"cannot create {name}: {os.strerror(exc.errno or 0)}")
        os.fchmod(fd, 0o600)  # ours, in our directory: whatever the umask took away
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
        """A new private directory for this run's files, never in /tmp, removed by ``drop_scratch``;
        what a killed run left (its pid and start name a process that is gone) goes at the next call."""
        base = self._file("scratch") if self.enabled else ""
        if not base or _usable(base) is not None:
            return None
        try:
            with os.scandir(base) as entries:
                for entry, _ in zip(entries, range(256)):  # a bounded look for leftovers
                    parts = entry.name.rsplit("-", 3)
                    if len(parts) == 4 and parts[1].isdigit() \
                            and parts[2].isdigit() and process_start_time(int(parts[1])) != parts[2]:
                        drop_scratch(entry.path)
            me = pidstat.stat(os.getpid())
            path = os.path.join(base, f"{what}-{os.getpid()}-{me.start if me else 0}-{os.urandom(4).hex()}")
            _mkdir_private(path)
        except OSError:
            return None
        return path

    def latch(self) -> dict[str, Any] | None:
        data = self.read_json(LATCH)
        if data is not None:
            if same_life(data.get("identity"), data.get("pid1")):
                return data
            self.remove(LATCH)
        try:  # the empty file that stands for the latch (see set_latch); stale ones are removed
            names = [n for n in os.listdir(self.path) if n.startswith(MARK)] if self.path else []
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
                         "reason": "a fatal error latched the container; its details could not be stored "
                                   "(the state dir was full)"}
            else:
                self.remove(name)
        return found

    # A child that survived SIGKILL sits in uninterruptible sleep on a wedged driver. Starting
    # another on every probe would pile them up: remember it while it exists.
    def stuck_child(self, key: str) -> int | None:
        data = self.read_json(f"stuck-{key}.json")
        if data is None:
            return None
        pid = data.get("pid")
        if (isinstance(pid, int) and same_life(data.get("identity"), data.get("pid1"))
                and data.get("start") == process_start_time(pid)):
            return pid
        self.remove(f"stuck-{key}.json")
        return None

    def remember_stuck(self, key: str, pid: int) -> None:
        self.write_json(f"stuck-{key}.json", {"pid": pid, "start": process_start_time(pid),
                                              "time": time.time(), "identity": life().ident,
                                              "pid1": life().pid1})

    def set_latch(self, source: str, reason: str, code: str | None = None) -> bool:
        """Latch unhealthy. A file system too full for ``latch.json`` usually still has an inode for an
        empty file, whose name keeps what the latch needs: ``latch@<identity>@<pid 1>@<source>@<code>``.
        False, the reason in ``problem``, when not even that could be written."""
        now = life()
        data = {"source": source, "reason": reason, "time": time.time(), "identity": now.ident,
                "pid1": now.pid1, **({"code": code} if code else {})}
        if self.write_json(LATCH, data):
            return True
        if not self.enabled:
            return False
        # No separator, slash or anything outside [A-Za-z0-9._:-] in the file name's parts.
        parts = ("".join(ch if ch.isascii() and (ch.isalnum() or ch in "._:-") else "_" for ch in part)[:80]
                 for part in (now.ident, now.pid1 or "?", source, code or ""))
        try:
            os.close(os.open(self._file(MARK + "@".join(parts)), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            self.problem = f"{self.problem}; not even an empty file: {os.strerror(exc.errno or 0)}"
            return False
        return True


def drop_scratch(path: str | None) -> None:
    if path:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
