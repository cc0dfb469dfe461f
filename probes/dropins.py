"""Drop-in checks: every executable file in HEALTHCHECK_CHECKS_DIR is a check, whose exit status,
first line and performance data are its result. The directory is untrusted input, as sudoers and
cron treat theirs; the contract and every rule: docs/probes.md, "Drop-in checks"."""

from __future__ import annotations

import os
import stat

from probes import childio, untrusted
from probes.record import Record
from probes.result import Result, passed, verdict
from probes.spec import ALL_PROFILES, Cause, Spec, cause
from probes.untrusted import clean, is_number_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes import proc

DIR_CHECK = "drop-ins"  # the one failure for a directory that may not be trusted
DEFAULT_PROFILES = ("startup", "readiness")
DEFAULT_TIMEOUT = 10.0
HEADER_TAG = b"healthcheck:"
HEADER_ACCEPTS = {"profiles": ", ".join(ALL_PROFILES), "timeout": "seconds, greater than 0 and at most 3600"}
MAX_NAME = 64
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
BACKUP_SUFFIXES = ("~", ".bak", ".swp", ".swo", ".orig", ".rej", ".tmp", ".old", ".new", ".dpkg-old",
                   ".dpkg-new", ".dpkg-dist", ".rpmsave", ".rpmnew", ".disabled")

# The causes a drop-in can report (docs/probes.md's table is generated from these). The image's
# owner writes the checks and what they check: the tenant acts on them.
PASSED = cause("", "exit 0", "none", "pass", action="none", actor="tenant")
WARNING = cause("check-warning", "exit 1 (warning)", "see the check's message", "warn", action="fix-config",
                actor="tenant")
FAILED = cause("check-failed", "exit 2 (critical)", "see the check's message", action="fix-config",
               actor="tenant")
UNKNOWN = cause("unknown", "exit 3 (unknown: the check could not decide; does not fail the run)",
                "see the check's message", "warn", action="retry", actor="tenant")
BAD_EXIT = cause("bad-exit", "any other exit status, or killed by a signal", "fix the check script",
                 action="fix-config", actor="tenant")
DEADLINE = cause("deadline", "no answer by its deadline", "the check hangs: fix it or raise its `timeout=`",
                 action="fix-config", actor="tenant")
UNTRUSTED = cause(
    "untrusted", "not run: the file is writable by group or others, owned by another user than root "
    "or the suite's, or a symbolic link; or (one failure, `drop-ins`) a directory on the way to "
    "`HEALTHCHECK_CHECKS_DIR` or a symbolic link there is another user's or writable by others",
    "`chown root` and `chmod go-w` what it names (a directory on the way may be sticky instead, as `/tmp`); "
    "replace a symbolic link by the file, or use a path no other user can change", action="fix-config",
    actor="tenant")
BAD_CHECK = cause(
    "bad-check", "not run: a bad header line, a file name that cannot be a check name, "
    "or one whose name or toggle is a built-in probe's or another drop-in's (reported as `drop-in-NAME`)",
    "rename the file (letters, digits, `.`, `_`, `-`; a toggle of its own), or fix its header line",
    action="fix-config", actor="tenant")
CANNOT_START = cause("cannot-start", "cannot be started (no `#!` line, a missing interpreter)",
                     "give it a `#!` line naming an installed interpreter, readable by the suite's user",
                     action="fix-config", actor="tenant")
# Its remedy is in the message: childio.limit_words names the limit and how to raise it (remedy=False).
LIMIT = cause("limit", "not checked: a resource limit of the container (open files, processes, memory) "
                       "kept the check from starting, or its file or directory (`drop-ins`) from being read; "
                       "the check is not at fault", "raise the limit the message names", "warn",
              action="fix-config", actor="tenant")
CAUSES = (PASSED, WARNING, FAILED, UNKNOWN, BAD_EXIT, DEADLINE, UNTRUSTED, BAD_CHECK, CANNOT_START, LIMIT)


def toggle_for(name: str) -> str:
    return "ENABLE_" + "".join(ch if ch.isalnum() else "_" for ch in name.upper()) + "_CHECK"


class Check(Record):  # one drop-in as found in the directory
    name: str
    path: str
    profiles: tuple[str, ...] = DEFAULT_PROFILES
    timeout: float = DEFAULT_TIMEOUT
    problem: str | None = None  # set: not run, reported with this detail...
    cause: Cause | None = None  # ...and this cause


def _parse_header(head: bytes) -> tuple[tuple[str, ...], float, str | None]:
    """(profiles, timeout, problem) from the ``# healthcheck:`` line among the first ten, if any."""
    profiles: tuple[str, ...] = DEFAULT_PROFILES
    timeout = DEFAULT_TIMEOUT
    lines = (raw.strip() for raw in head.split(b"\n")[:10])
    header = next((line for line in lines if line.startswith(b"#") and HEADER_TAG in line), b"")
    for item in header.partition(HEADER_TAG)[2].decode("utf-8", "replace").split():
        key, sep, value = item.partition("=")
        names = tuple(p for p in value.split(",") if p)
        if key == "profiles" and sep and names and all(p in ALL_PROFILES for p in names):
            profiles = names
        elif key == "timeout" and sep and is_number_text(value) and 0 < float(value) <= 3600:
            timeout = float(value)
        else:
            why = HEADER_ACCEPTS.get(key) if sep else None
            shown = f"{key}={clean(value, 40)}" if why else f"unknown setting {clean(item, 40)}"
            return profiles, timeout, f"header: {shown} (accepted: {why or 'profiles=..., timeout=...'})"
    return profiles, timeout, None


def specs(directory: str, reserved: frozenset[str] = frozenset(),
          toggles: dict[str, str] | None = None) -> tuple[Spec, ...]:
    """The drop-ins in ``directory`` by name as probe specs, run by this module's gather and judge.
    ``reserved``: the built-in probes' names; ``toggles``: their toggles, each with whose it is. A
    directory reached through anything another user controls is one failure (``DIR_CHECK``)."""
    taken = dict(toggles or {})
    try:
        dir_fd = untrusted.open_trusted_dir(directory, (0, os.geteuid()))
        try:
            names = sorted(e.name for e in os.scandir(dir_fd)
                           if not e.name.startswith((".", "#")) and not e.name.endswith(BACKUP_SUFFIXES))
            found = [_entry(dir_fd, directory, name, reserved, taken) for name in names]
        finally:
            os.close(dir_fd)
    except untrusted.Refused as exc:
        found = [Check(DIR_CHECK, directory, problem=f"HEALTHCHECK_CHECKS_DIR={clean(directory, 80)}: {exc}: "
                       "nothing in it is run", cause=UNTRUSTED)]
    except OSError as exc:  # nothing to run; a resource limit's is one warning: the checks did not vanish
        words = childio.limit_words(exc.errno)
        found = [Check(DIR_CHECK, directory, problem=f"HEALTHCHECK_CHECKS_DIR={clean(directory, 80)} could "
                       f"not be read: {words}; nothing in it is run", cause=LIMIT)] if words else []
    return tuple(Spec(c.name, layer="drop-in", module=__name__, toggle=toggle_for(c.name), timeout=c.timeout,
                      profiles=c.profiles, about=f"drop-in check {clean(c.path, 120)}", dropin=c)
                 for c in found if c is not None)


def _entry(dir_fd: int, directory: str, name: str, reserved: frozenset[str],
           taken: dict[str, str]) -> Check | None:
    """The check the directory entry ``name`` is, None when it is not an executable file."""
    try:
        lst = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    path, shown = os.path.join(directory, name), clean(name, MAX_NAME)
    if stat.S_ISLNK(lst.st_mode):
        return Check(shown, path, problem=f"{shown} is a symbolic link (not followed)", cause=UNTRUSTED)
    if not stat.S_ISREG(lst.st_mode) or not lst.st_mode & 0o111:
        return None  # directories, FIFOs, sockets, devices and plain files are not checks
    if len(name) > MAX_NAME or any(ch not in NAME_CHARS for ch in name):
        return Check(shown, path, cause=BAD_CHECK, problem=f"the file name {shown!r} cannot be a check name "
                     "(accepted: letters, digits, '.', '_', '-'; at most 64)")
    # A name taken by a built-in probe or its toggle, or a toggle another drop-in took: drop-in-NAME.
    if name in reserved:
        return Check(f"drop-in-{shown}", path, cause=BAD_CHECK,
                     problem=f"the file name {shown!r} is the name of a built-in probe")
    toggle = toggle_for(name)
    owner = taken.setdefault(toggle, f"the drop-in {shown!r}")  # taken: each toggle in use, and whose
    if owner != f"the drop-in {shown!r}":
        return Check(f"drop-in-{shown}", path, cause=BAD_CHECK, problem=f"the file name {shown!r} would "
                     f"share its toggle {toggle} with {owner}: {toggle}=false would silently skip it")
    why = untrusted.distrust(lst, name, (0, os.geteuid()))
    if why is not None:
        why += ", not root or the suite's user" if "owned by" in why else ""
        return Check(name, path, problem=why, cause=UNTRUSTED)
    try:
        fd = os.open(name, untrusted.READ, dir_fd=dir_fd)
        try:
            st, head = os.fstat(fd), os.read(fd, 4096)  # the header is in the first lines
        finally:
            os.close(fd)
    except OSError as exc:
        words = childio.limit_words(exc.errno)
        if words is not None:
            return Check(name, path, problem=f"{name} could not be read: {words}", cause=LIMIT)
        why = f"cannot read {name} ({os.strerror(exc.errno or 0)})"
        return Check(name, path, problem=why, cause=CANNOT_START)
    if (st.st_ino, st.st_dev) != (lst.st_ino, lst.st_dev):  # replaced while we looked
        return Check(name, path, problem=f"{name} changed while it was read", cause=UNTRUSTED)
    profiles, timeout, problem = _parse_header(head)
    return Check(name, path, profiles, timeout, problem, BAD_CHECK if problem else None)


UNITS = ("us", "ms", "s", "%", "B", "KB", "MB", "GB", "TB", "c")  # Nagios performance data's


# ctx: a probes.context.Context, which imports probes.config, which reads the drop-ins here.
def gather(ctx: Any) -> tuple[proc.Completed | None, float]:
    """The check's run (None: not run, its problem says why) and the seconds it had."""
    check: Check = ctx.spec.dropin
    budget = ctx.remaining()
    if check.problem is not None:
        return None, budget
    from probes import proc

    env = {**os.environ, "HEALTHCHECK_PROFILE": ctx.config.profile}
    return proc.run([check.path], deadline=ctx.deadline, env=env, cwd="/"), budget


def _perfdata(text: str) -> tuple[Any, str | None]:
    """(value, unit) of the first ``label=value[unit]`` item of Nagios performance data."""
    value = text.strip().split(" ")[0].partition("=")[2].split(";", 1)[0]
    unit = next((u for u in sorted(UNITS, key=len, reverse=True) if value.endswith(u)), None)
    number = value[: len(value) - len(unit)] if unit else value
    try:
        parsed = untrusted.finite(number)
    except ValueError:
        return None, None
    return (int(parsed) if parsed.is_integer() and "." not in number else parsed), unit


def judge(data: tuple[proc.Completed | None, float], ctx: Any) -> Result:
    (done, budget), check = data, ctx.spec.dropin
    name = check.name
    if done is None:
        assert check.cause is not None
        said = {UNTRUSTED: "untrusted", LIMIT: "not checked"}.get(check.cause, "not run")
        return verdict(name, check.cause, f"{said}: {check.problem}", remedy=check.cause != LIMIT)
    if childio.limited(done.spawn_error):  # the container's limit: no "#! line" to blame, nothing checked
        return verdict(name, LIMIT, f"not checked: {clean(check.path, 120)} {done.spawn_error}",
                       remedy=False)
    if done.spawn_error:
        return verdict(name, CANNOT_START, f"cannot start {clean(check.path, 120)} ({done.spawn_error})")
    message, _, perf = done.stdout.split(b"\n", 1)[0].decode("utf-8", "replace").partition("|")
    message = clean(" ".join(message.split()), 200)
    said = f"; it said: {message}" if message else ""
    if done.timed_out or done.stuck:
        return verdict(name, DEADLINE, f"no answer within {budget:.1f}s (deadline passed){said}")
    if done.signal is not None:
        from probes import proc

        return verdict(name, BAD_EXIT, f"killed by {proc.signal_name(done.signal)}{said}")
    code = done.returncode
    if code not in (0, 1, 2, 3):
        return verdict(name, BAD_EXIT, f"exit {code} is not a check result "
                       f"(0 pass, 1 warn, 2 fail, 3 unknown){said}")
    # The check's own first line is the message, and its own remedy: nothing is added to it.
    found = (PASSED, WARNING, FAILED, UNKNOWN)[code]
    text = message or f"exit {code} with no message"
    observed, unit = _perfdata(perf)
    if found is PASSED:
        return passed(name, text, observed=observed, unit=unit)
    return verdict(name, found, f"unknown: {text}" if found is UNKNOWN else text, remedy=False,
                   observed=observed, unit=unit)
