"""HEALTHCHECK_LOG_FILE: a size-bounded run log that can never hurt the run (docs/probes.md):
opened without blocking and never through a link; a failure is remembered, never raised."""

from __future__ import annotations

import contextlib
import errno
import logging
import logging.handlers
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Callable

MAX_BYTES = 1 << 20  # then one rotation to <file>.1
FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _why(exc: OSError) -> str:
    # O_NOFOLLOW met a symbolic link (ELOOP); an O_NONBLOCK write-open, a FIFO nobody reads (ENXIO).
    words = {errno.ELOOP: "a symbolic link is refused", errno.ENXIO: "not a regular file"}
    return words.get(exc.errno or 0, exc.strerror or "unusable")


class SafeFileHandler(logging.handlers.RotatingFileHandler):
    """Opens safely; its errors are kept in ``failure``, the first told to ``on_error``."""

    def __init__(self, path: str, on_error: Callable[[str], None] | None = None) -> None:
        self.failure: str | None = None
        self._on_error = on_error
        super().__init__(path, maxBytes=MAX_BYTES, backupCount=1, encoding="utf-8")

    def _open(self) -> IO[str]:  # type: ignore[override]
        """The file opened for appending if it is (or becomes) a regular file, else OSError."""
        try:
            fd, made = os.open(self.baseFilename, FLAGS | os.O_EXCL, 0o600), True
        except FileExistsError:
            fd, made = os.open(self.baseFilename, FLAGS, 0o600), False
        try:
            if made:  # 0600 whatever the umask (0277 would leave it unwritable by our next run)
                os.fchmod(fd, 0o600)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            os.set_blocking(fd, True)
            return os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")
        except BaseException:
            os.close(fd)
            raise

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        first = self.failure is None
        self.failure = _why(exc) if isinstance(exc, OSError) else type(exc).__name__
        if first and self._on_error is not None:
            with contextlib.suppress(Exception):  # the warning is best effort by design
                self._on_error(self.failure)


def attach(logger: logging.Logger, path: str, fmt: str, *,
           on_error: Callable[[str], None] | None = None) -> tuple[SafeFileHandler | None, str | None]:
    """(handler, None), or (None, why ``path`` cannot be used)."""
    try:
        handler = SafeFileHandler(path, on_error)
    except OSError as exc:
        return None, f"log file {path} not usable ({_why(exc)})"
    handler.setFormatter(logging.Formatter(fmt))
    logger.addHandler(handler)
    return handler, None
