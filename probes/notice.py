"""Tell the person at the keyboard the verdict of the profiles that ``tell``: a line in the container's
log when it changes, and the notice the login and notebook readers show (docs/image.md, "Notices")."""

from __future__ import annotations

import contextlib
import os
import time

from probes import pidstat
from probes.context import log_exception
from probes.deadlines import NOTICE_WAIT
from probes.record import Record
from probes.result import Status
from probes.state import life_identity
from probes.untrusted import Refused, clean, open_trusted_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from probes.config import Config
    from probes.runner import Outcome
    from probes.spec import Cause, Spec
    from probes.state import State

START_PERIOD = 60.0  # the image's HEALTHCHECK --start-period: Docker does not count a failure in it
RECORD = "notice.json"  # in the private state dir: what was told, in which container life
LOG_ENV = "_HEALTHCHECK_NOTICE_LOG"  # internal, for tests only: the log line goes there instead
MAX_PART = 300  # characters of what failed, and of who acts
MAX_LINE = 700  # characters of a log line
OPERATOR = "not fixable from inside this container; your platform's operator is alerted if alerting is set up"


class Verdict(Record):  # a check's verdict as the person is told it
    time: float  # when its results were taken (wall clock)
    key: str = ""  # "probe/reason" of the first failure; "" when healthy
    what: str = ""  # "nvml: GPU 0 is lost": the probe and what it observed, without the remedy
    words: str = ""  # who acts, and what the person can do
    action: str = ""  # the cause's action (reboot-node, ...), for the operator reading the log


def verdict_of(outcome: Outcome, probes: Iterable[Spec]) -> Verdict:
    """Healthy unless the run failed (exit 1); then its first failure, in its cause's words."""
    when = max((r.time for r in outcome.results), default=0.0) or time.time()
    problem = outcome.first_problem if outcome.status is Status.FAIL else None
    if problem is None:
        return Verdict(when)
    from probes import dropins, runner

    spec = next((s for s in probes if s.name == problem.name), None)
    tables: tuple[tuple[Cause, ...], ...] = (runner.COMMON_CAUSES, dropins.CAUSES)
    if spec is not None:  # its own causes first: a drop-in's `deadline` is its owner's, not the runner's
        tables = (dropins.CAUSES if spec.dropin is not None else spec.causes, runner.COMMON_CAUSES)
    cause = next((c for table in tables for c in table if c.reason == problem.reason), None)
    remedy = cause.remedy.replace("`", "") if cause is not None else ""
    detail = problem.message.removesuffix(f": {remedy}") if remedy else problem.message
    words = OPERATOR if problem.actor != "tenant" else (
        f"you can fix this: {remedy}" if remedy else "you can fix this (the message says how)")
    return Verdict(when, f"{problem.name}/{problem.reason}", clean(f"{problem.name}: {detail}", MAX_PART),
                   clean(words, MAX_PART), problem.action or "")


def clock(when: float) -> str:
    return time.strftime("%H:%M UTC", time.gmtime(when))


def decide(kept: Any, v: Verdict, *, life: str, started: float | None,
           stale: int) -> tuple[dict[str, Any], str | None, str]:
    """From the record the last check kept and this verdict: the record to keep, the log line (None:
    nothing changed) and the notice to publish. A failure before the first healthy verdict of this
    container life, within START_PERIOD of its start, is not told (Docker does not count it either)."""

    def unhealthy(since: float) -> str:
        return f"unhealthy since {clock(since)}: {v.what}"
    record: dict[str, Any] = kept if isinstance(kept, dict) and kept.get("life") == life else {"life": life}
    told = record["told"] if isinstance(record.get("told"), dict) else None
    line = None
    if not v.key:
        shown = "healthy"
        line = f"healthy again at {clock(v.time)}" if told is not None else None
        record = {"life": life, "healthy_seen": True, "told": None}
    elif (told is None and not record.get("healthy_seen") and started is not None
          and v.time - started < START_PERIOD):
        shown = "starting"
    else:
        shown = "unhealthy"
        if told is None or told.get("key") != v.key:
            told = {"key": v.key, "since": v.time}
            record = {**record, "told": told}
            act = f" ({v.action})" if v.action not in ("", "none") else ""
            line = f"{unhealthy(v.time)}; {v.words}{act}"
    text = f"{int(v.time)} {stale} {shown} {clock(v.time)}\n"
    if shown == "unhealthy" and told is not None:
        since = told.get("since")
        text += f"{unhealthy(since if isinstance(since, (int, float)) else v.time)}\n{v.words}\n"
    return record, None if line is None else clean(f"gpu-health: {line}", MAX_LINE), text


def tell(config: Config, state: State, outcome: Outcome) -> None:
    """Never raises; waits at most NOTICE_WAIT for another check that is telling. A run of
    ``--only``/``--skip`` is not the container's verdict."""
    rules = config.profile_rules
    if not rules.tells or config.only or config.skip or not outcome.results:
        return
    try:
        if not config.notices:
            unpublish(config.notice_file)
        elif state.enabled:
            v = verdict_of(outcome, outcome.specs)
            with state.lock("notice.lock", time.monotonic() + NOTICE_WAIT) as held:
                if not held:  # concurrent checks tell a change once
                    return
                kept = state.read_json(RECORD)
                record, line, text = decide(kept, v, life=life_identity(), started=container_started(),
                                            stale=rules.stale_after)
                if record != kept and not state.write_json(RECORD, record):
                    line = None  # not kept: the next run would tell it again, so it is not told now
                if line is not None:
                    log_line(line)
                publish(config.notice_file, text)
    except Exception:  # what the person is told never costs the verdict; a bug goes to the log
        log_exception("telling the verdict failed")


def container_started() -> float | None:
    """When this container started (wall clock): PID 1's start, else when /proc was mounted."""
    st = pidstat.stat(1)
    if st is not None:
        try:
            with open("/proc/uptime", "rb") as fh:
                up = float(fh.read().split()[0])
            return time.time() - up + st.start / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    try:
        return os.stat("/proc").st_mtime
    except OSError:
        return None


def log_line(line: str) -> None:
    """Into PID 1's stderr, non-blocking (a full pipe costs the line, never the run), in one write
    of under PIPE_BUF bytes: never interleaved with another writer's."""
    try:
        fd = os.open(os.environ.get(LOG_ENV) or "/proc/1/fd/2",
                     os.O_WRONLY | os.O_NONBLOCK | os.O_APPEND | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            os.write(fd, (line + "\n").encode("utf-8", "backslashreplace"))
        finally:
            os.close(fd)
    except OSError:
        pass


def _notice_dir(where: str) -> int | None:
    """The notice's directory, trusted component by component; made 0755 (the readers are other users)."""
    owners = (0, os.geteuid())
    parent, name = os.path.split(where)
    try:
        up = open_trusted_dir(parent, owners)
        try:
            os.mkdir(name, 0o755, dir_fd=up)
            os.chmod(name, 0o755, dir_fd=up)  # noqa: S103 - readers are other users; the umask may take it
        except FileExistsError:
            pass
        finally:
            os.close(up)
        return open_trusted_dir(where, owners)
    except (OSError, Refused):
        return None


def publish(path: str, text: str) -> None:
    where, name = os.path.split(path)
    fd = _notice_dir(where)
    if fd is None:
        return
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        _unlink(tmp, fd)  # a killed run's, of a reused pid
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(tmp, flags, 0o644, dir_fd=fd)
        try:
            os.fchmod(out, 0o644)
            os.write(out, text.encode("utf-8", "backslashreplace"))
        finally:
            os.close(out)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:
        _unlink(tmp, fd)
    finally:
        os.close(fd)


def unpublish(path: str) -> None:
    """Notices off: no notice left from before for the readers to show."""
    where, name = os.path.split(path)
    fd = _notice_dir(where) if os.path.lexists(path) else None  # there: nothing is made
    if fd is not None:
        _unlink(name, fd)
        os.close(fd)


def _unlink(name: str, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=fd)
