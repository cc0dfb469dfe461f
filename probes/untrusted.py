"""Text, JSON and files from outside the suite: cleaned, bounded and checked before use.

Everything that another program or another user controls passes through here before it
reaches a result, a report or a decision: GPU names and versions, server replies, file
names, settings, and files in directories another user can write. ``clean`` is idempotent:
cleaning clean text changes nothing.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import Any

MAX_TEXT = 300  # characters of one cleaned value unless the caller says otherwise
MAX_DEPTH = 32  # nesting of arrays and objects in any JSON the suite reads
MAX_INT_DIGITS = 30  # far beyond any count, size or pid; float() of it is always finite
ELLIPSIS = "..."
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def clean(value: Any, limit: int = MAX_TEXT) -> str:
    """``value`` as one printable line of at most ``limit`` characters.

    Bytes are decoded as UTF-8 (invalid bytes become U+FFFD). Characters that are not
    printable (Unicode categories Other and Separator, except the ASCII space) are shown
    as Python-style escapes, so nothing invisible reaches a terminal, a log or JSON, and
    nothing is silently lost. Longer text is cut and ends with ``...``.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        text = bytes(value[: limit * 4 + 4]).decode("utf-8", "replace")
    else:
        text = str(value)
    text = text[: limit * 4 + 4]  # bound the work: each character shows as at most 10
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else _visible(ch) for ch in text)
    if len(text) <= limit:
        return text
    return text[: max(limit - len(ELLIPSIS), 0)] + ELLIPSIS


def squeeze(value: Any, limit: int = MAX_TEXT) -> str:
    """Like ``clean``, but runs of whitespace (newlines included) become one space first:
    for multi-line output of a program whose gist, not its layout, goes into a message. Leading
    whitespace goes before the cut, so output that starts with a long blank run still shows."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).lstrip()[: limit * 4 + 4].decode("utf-8", "replace")
    return clean(" ".join(str(value).lstrip()[: limit * 4 + 4].split()), limit)


# ---------------------------------------------------------------------------------- JSON

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError("integer too large")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number too large")
    return value


def depth_within(doc: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays and objects in ``doc`` nest at most ``limit`` deep (iterative)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def _loads(text: str) -> Any:
    """``json.loads`` with the hooks above: the public API, whatever else the run imported.

    Importing json costs a liveness run that reads Jupyter's runtime file about 3 ms (make bench).
    It is paid: json's C scanner, called without the package, raises SystemError instead of
    JSONDecodeError on malformed input, and a parser must raise the same whatever ran first.
    """
    import json

    return json.loads(text, parse_constant=_no_constant, parse_int=_bounded_int, parse_float=_finite_float)


def load_json(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse untrusted JSON; ``ValueError`` for anything malformed, too deep or out of range.

    NaN and Infinity are refused, integers are bounded to ``MAX_INT_DIGITS`` digits and
    floats must be finite, so later arithmetic (``float(x)``) can never overflow. Bytes
    must be UTF-8 (a byte order mark is allowed), as RFC 8259 asks of JSON between systems.
    """
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = bytes(raw).decode("utf-8")  # not "utf-8-sig": one codec module less to import
        except UnicodeDecodeError:
            raise ValueError("not UTF-8") from None
        raw = raw[1:] if raw.startswith("\ufeff") else raw
    try:
        doc = _loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not depth_within(doc, max_depth):
        raise ValueError("nested too deeply")
    return doc


# ---------------------------------------------------------------------------------- files

class Refused(Exception):
    """A file that is not used; ``str(exc)`` says why in a few words (safe to show)."""


def read_regular(path: str, max_size: int, *, dir_fd: int | None = None,
                 owners: Collection[int] | None = None) -> tuple[bytes, os.stat_result]:
    """The content and status of ``path`` if it is a regular file we may trust; else ``Refused``.

    The last component is opened with O_NOFOLLOW (a symlink is refused) and O_NONBLOCK
    (a FIFO or device never blocks the caller); type, size and, with ``owners``, the
    owning uid are checked on the open descriptor, so nothing can be swapped in between.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise Refused("a symbolic link" if exc.errno == errno.ELOOP else  # O_NOFOLLOW met a link
                      f"cannot open ({os.strerror(exc.errno or 0)})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("not a regular file")
        if owners is not None and st.st_uid not in owners:
            raise Refused(f"owned by uid {st.st_uid}")
        if st.st_size > max_size:
            raise Refused(f"larger than {max_size} bytes")
        chunks = []
        size = 0
        while size <= max_size:
            chunk = os.read(fd, max_size + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_size:  # it grew while we read
            raise Refused(f"larger than {max_size} bytes")
        return b"".join(chunks), st
    except OSError as exc:
        raise Refused(f"cannot read ({os.strerror(exc.errno or 0)})") from None
    finally:
        os.close(fd)


MAX_LINKS = 40  # symbolic links one path may pass through (the kernel's own limit: ELOOP)


def distrust(st: os.stat_result, what: str, owners: Collection[int], *,
             sticky_ok: bool = False) -> str | None:
    """Why a file or directory with this status may not be trusted, or None: it must be owned by
    one of ``owners`` and not writable by group or others (a sticky directory may be, with
    ``sticky_ok``: nobody else can rename or replace what is ours in it)."""
    if st.st_uid not in owners:
        return f"{what} is owned by uid {st.st_uid}"
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def open_trusted_dir(path: str, owners: Collection[int]) -> int:
    """A descriptor of the directory ``path`` (O_RDONLY), reached without trusting anyone else.

    Every component is judged on the way, as sudo and cron judge the path to their files (the
    rules: docs/probes.md, "Drop-in checks"). Each step opens the next component relative to the
    last one with O_NOFOLLOW, so what was judged is what is used. ``Refused`` names the component
    that may not be trusted; an OSError (FileNotFoundError, NotADirectoryError) when the path does
    not lead to a directory.
    """
    step = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    todo = path.split("/")[::-1]  # a stack: the next component is last
    fds = [os.open("/", step)]  # the directories walked so far, for ".."
    where = [""]
    links = 0
    try:
        problem = distrust(os.fstat(fds[0]), "/", owners, sticky_ok=True)
        while todo and problem is None:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if len(fds) > 1:
                    os.close(fds.pop())
                    where.pop()
                continue
            here = f"{where[-1]}/{name}"
            st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if st.st_uid not in owners:
                    problem = f"{here} is a symbolic link owned by uid {st.st_uid}"
                elif links > MAX_LINKS:
                    problem = f"{here}: more than {MAX_LINKS} symbolic links"
                else:
                    target = os.readlink(name, dir_fd=fds[-1])
                    todo.extend(target.split("/")[::-1])
                    while target.startswith("/") and len(fds) > 1:
                        os.close(fds.pop())
                        where.pop()
                continue
            fds.append(os.open(name, step, dir_fd=fds[-1]))
            where.append(here)
            opened = os.fstat(fds[-1])
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                problem = f"{here} changed while it was checked"
            else:
                problem = distrust(opened, here, owners, sticky_ok=True)
        if problem is None:
            problem = distrust(os.fstat(fds[-1]), where[-1] or "/", owners)
        if problem is not None:
            raise Refused(clean(problem, 200))
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)
