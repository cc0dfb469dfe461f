"""Text, JSON and files from outside the suite (what another program or user controls): cleaned,
bounded and checked before they reach a result, a report or a decision. ``clean`` is idempotent."""

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
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC  # never a link, never blocks
NUMBER_FORM = "digits with an optional fraction, e.g. 25 or 2.5"


# Number grammar: float() takes ' 1e3 ', 'nan' and '1_000'; str.isdigit takes '\u00b2', which int() refuses.
def is_integer_text(text: str) -> bool:
    return bool(text) and all("0" <= ch <= "9" for ch in text)


def is_number_text(text: str) -> bool:
    whole, dot, frac = text.partition(".")
    if frac and not is_integer_text(frac):
        return False
    return is_integer_text(whole) or (not whole and bool(dot) and bool(frac))


def clean(value: Any, limit: int = MAX_TEXT) -> str:
    """``value`` as one printable line of at most ``limit`` characters: bytes read as UTF-8, what
    is not printable as Python's escapes (nothing invisible shown, nothing silently lost), longer
    text cut to end with ``...``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value[: limit * 4 + 4]).decode("utf-8", "replace")
    text = str(value)[: limit * 4 + 4]  # bound the work: each character shows as at most 10
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def squeeze(value: Any, limit: int = MAX_TEXT) -> str:
    """``clean`` after runs of whitespace, newlines included, become one space (leading whitespace
    goes before the cut): for a program's output whose gist, not its layout, goes into a message."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).lstrip()[: limit * 4 + 4].decode("utf-8", "replace")
    return clean(" ".join(str(value).lstrip()[: limit * 4 + 4].split()), limit)


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError("integer too large")
    return int(text)


def finite(text: str) -> float:  # a number, or NaN and Infinity, which do not end in a digit
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("number too large" if text[-1].isdigit() else f"{text} is not a number JSON allows")
    return value


def load_json(raw: bytes | str) -> Any:
    """Parse untrusted JSON; ``ValueError`` for anything malformed, nested deeper than MAX_DEPTH or
    out of range (NaN, Infinity, more than MAX_INT_DIGITS digits, an infinite float): later
    arithmetic can never overflow. Bytes must be UTF-8, as RFC 8259 asks (a byte order mark is allowed)."""
    # The json package, not its C scanner alone (which raises SystemError on malformed input):
    # a parser must raise the same whatever else the run imported.
    import json

    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = bytes(raw).decode("utf-8")  # not "utf-8-sig": one codec module less to import
        except UnicodeDecodeError:
            raise ValueError("not UTF-8") from None
        raw = raw[1:] if raw.startswith("\ufeff") else raw
    try:
        doc = json.loads(raw, parse_constant=finite, parse_int=_bounded_int, parse_float=finite)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    stack: list[tuple[Any, int]] = [(doc, 1)] if isinstance(doc, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError("nested too deeply")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return doc


class Refused(Exception):
    """A file that is not used; ``str(exc)`` says why in a few words (safe to show)."""


def read_regular(path: str, max_size: int, *, dir_fd: int | None = None,
                 owners: Collection[int] | None = None) -> tuple[bytes, os.stat_result]:
    """``Refused`` unless a regular file we may trust: no link followed, a FIFO never blocks, type,
    size and owner checked on the open file."""
    try:
        fd = os.open(path, READ, dir_fd=dir_fd)
    except OSError as exc:
        raise Refused("a symbolic link" if exc.errno == errno.ELOOP else  # O_NOFOLLOW met a link
                      f"cannot open ({os.strerror(exc.errno or 0)})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("not a regular file")
        if owners is not None and st.st_uid not in owners:
            raise Refused(f"owned by uid {st.st_uid}")
        data = b""
        while chunk := os.read(fd, max_size + 1 - len(data)):
            data += chunk
            if len(data) > max_size:
                raise Refused(f"larger than {max_size} bytes")
        return data, st
    except OSError as exc:
        raise Refused(f"cannot read ({os.strerror(exc.errno or 0)})") from None
    finally:
        os.close(fd)


MAX_LINKS = 40  # symbolic links one path may pass through (the kernel's own limit: ELOOP)


def distrust(st: os.stat_result, what: str, owners: Collection[int], *,
             sticky_ok: bool = False) -> str | None:
    """Why a file or directory with this status may not be trusted (another owner, writable by group
    or others: a sticky directory may be with ``sticky_ok``), or None."""
    if st.st_uid not in owners:
        return f"{what} is owned by uid {st.st_uid}"
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def open_trusted_dir(path: str, owners: Collection[int]) -> int:
    """A descriptor of the directory ``path``, reached without trusting anyone else: every component
    is judged on the way, as sudo and cron judge theirs, and opened relative to the last without
    following a link, so what was judged is what is used. ``Refused`` names the component that may
    not be trusted; OSError when the path leads to no directory."""
    step = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    todo = path.split("/")[::-1]  # a stack: the next component is last
    walked, links = [(os.open("/", step), "")], 0  # each directory so far (for ".."), with its path
    try:
        problem = distrust(os.fstat(walked[0][0]), "/", owners, sticky_ok=True)
        while todo and problem is None:
            name = todo.pop()
            if name in ("", ".", ".."):
                if name == ".." and len(walked) > 1:
                    os.close(walked.pop()[0])
                continue
            fd, here = walked[-1][0], f"{walked[-1][1]}/{name}"
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if st.st_uid not in owners:
                    problem = f"{here} is a symbolic link owned by uid {st.st_uid}"
                elif links > MAX_LINKS:
                    problem = f"{here}: more than {MAX_LINKS} symbolic links"
                else:
                    target = os.readlink(name, dir_fd=fd)
                    todo.extend(target.split("/")[::-1])
                    while target.startswith("/") and len(walked) > 1:
                        os.close(walked.pop()[0])
                continue
            walked.append((os.open(name, step, dir_fd=fd), here))
            opened = os.fstat(walked[-1][0])
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                problem = f"{here} changed while it was checked"
            else:
                problem = distrust(opened, here, owners, sticky_ok=True)
        fd, here = walked[-1]
        if problem is None:
            problem = distrust(os.fstat(fd), here or "/", owners)
        if problem is not None:
            raise Refused(clean(problem, 200))
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    finally:
        for fd, _ in walked:
            os.close(fd)
