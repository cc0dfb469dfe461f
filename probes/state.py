"""The state directory: cached results, locks and the sticky CUDA-fatal latch.

Default location: ``/run/healthcheck`` when writable, else ``$XDG_RUNTIME_DIR/healthcheck``,
else ``/tmp/healthcheck-<uid>``. The directory is created 0700 and must be a real
directory owned by us (a symlink or a directory planted by someone else is refused).
If it cannot be used the suite still runs, with caching off, and says so.
"""

from __future__ import annotations

import _thread
import errno
import fcntl
import os
import stat
import time

from probes import pidstat
from probes.untrusted import Refused, load_json, read_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LATCH = "latch.json"
MAX_FILE = 1 << 20  # no state file is anywhere near this size


def default_dir() -> str:
    if os.access("/run", os.W_OK):
        return "/run/healthcheck"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "healthcheck")
    import tempfile  # rarely reached; importing it costs ~4 ms on every run

    return os.path.join(tempfile.gettempdir(), f"healthcheck-{os.getuid()}")


def _usable(path: str) -> str | None:
    """Create ``path`` (0700) if needed; return why it cannot be used, or None."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {path}: {os.strerror(exc.errno or 0)}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot stat {path}: {os.strerror(exc.errno or 0)}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (a symlink or file is refused)"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to us"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable"
    return None


def process_start_time(pid: int) -> str | None:
    """A live process's start time (clock ticks since boot; tells a reused pid apart),
    or None if it is gone or a zombie."""
    st = pidstat.stat(pid)
    return None if st is None or st.state == b"Z" else str(st.start)


def pid1_identity() -> str:
    """Identifies this container's life: boot id plus PID 1's start time.

    A container restart starts a new PID 1, so a latch recorded under another
    identity belongs to an earlier life and no longer applies.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
            boot = fh.read().decode().strip()
    except OSError:
        boot = "?"
    st = pidstat.stat(1)
    return f"{boot}:{st.start if st is not None else '?'}"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Lock:
    """A lock file's descriptor, held until the ``with`` block ends (closing it releases the
    lock); ``None`` when not had. A class, not ``contextlib.contextmanager``: contextlib costs
    every run, liveness included, ~1 ms of start-up (make bench)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def __enter__(self) -> bool:
        return self._fd is not None

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class State:
    """Access to the state directory; every method degrades to a no-op when it is off."""

    def __init__(self, path: str | None, disabled_reason: str | None = None):
        self.path = path
        self.disabled_reason = disabled_reason

    @classmethod
    def open(cls, path: str | None) -> State:
        path = path or default_dir()
        why = _usable(path)
        return cls(None, why) if why else cls(path)

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
        """The stored object, or None when absent, unreadable or corrupt."""
        if not self.enabled:
            return None
        try:
            raw, _ = read_regular(self._file(name), MAX_FILE)
            data = load_json(raw)  # bounded nesting, finite numbers: damage is a miss
        except (Refused, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_json(self, name: str, data: dict[str, Any]) -> bool:
        """Atomically replace ``name``; False (never an exception) when it cannot."""
        if not self.enabled:
            return False
        # One temporary file per writing thread: serve's monitor threads write serve.json at
        # once, and two writers sharing one would interleave into a torn file.
        tmp = self._file(f".{name}.{os.getpid()}.{_thread.get_ident()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            import json  # reading goes through probes.untrusted; only writers need this

            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, separators=(",", ":"))
            os.replace(tmp, self._file(name))
            return True
        except (OSError, TypeError, ValueError):
            _unlink(tmp)
            return False

    def remove(self, name: str) -> None:
        if self.enabled:
            _unlink(self._file(name))

    def lock(self, name: str, deadline: float) -> Lock:
        """``with state.lock(name, deadline) as held``: an exclusive lock, held until the block
        ends; ``held`` is False if it was not had by ``deadline`` (a time.monotonic() value)
        or when the state dir is off."""
        if not self.enabled:
            return Lock(None)
        try:
            fd = os.open(self._file(name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return Lock(None)
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

    # The sticky latch: a fatal CUDA error (or a critical Xid seen by `serve`)
    # keeps the container unhealthy until it restarts.
    def latch(self) -> dict[str, Any] | None:
        """The latch in force for this container life, or None. A stale one is cleared."""
        data = self.read_json(LATCH)
        if data is None:
            return None
        if data.get("identity") != pid1_identity():
            self.remove(LATCH)
            return None
        return data

    # A child that survived SIGKILL sits in uninterruptible sleep on a wedged driver. Starting
    # another on every probe would pile them up: remember it while it exists.
    def stuck_child(self, key: str) -> int | None:
        """The pid of an earlier ``key`` child that is still stuck, or None (a stale entry is cleared)."""
        name = f"stuck-{key}.json"
        data = self.read_json(name)
        if data is None:
            return None
        pid = data.get("pid")
        if (isinstance(pid, int) and data.get("identity") == pid1_identity()
                and data.get("start") == process_start_time(pid)):
            return pid
        self.remove(name)
        return None

    def remember_stuck(self, key: str, pid: int) -> None:
        self.write_json(f"stuck-{key}.json", {"pid": pid, "start": process_start_time(pid),
                                               "time": time.time(), "identity": pid1_identity()})

    def set_latch(self, source: str, reason: str, code: str | None = None) -> bool:
        """Latch unhealthy: ``source`` (the probe, or "xid"), the message, and its reason code."""
        data = {"source": source, "reason": reason, "time": time.time(), "identity": pid1_identity()}
        if code:
            data["code"] = code
        return self.write_json(LATCH, data)
