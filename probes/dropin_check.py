"""Running one drop-in check: the probe module that every drop-in's spec names.

What a drop-in is, how the directory is read and trusted, and the causes are in
``probes.dropins``; here the check is started through ``probes.proc.run`` and its exit
status, first line and performance data become the result.
"""

from __future__ import annotations

import os

from probes.record import Record
from probes.result import Result, failed, passed, warned
from probes.untrusted import clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes import proc
    from probes.context import Context
    from probes.dropins import Check

MAX_MESSAGE = 200
UNITS = ("us", "ms", "s", "%", "B", "KB", "MB", "GB", "TB", "c")


class Ran(Record):
    __slots__ = ("check", "done", "budget")

    check: Check
    done: proc.Completed | None  # None: not run (check.problem says why)
    budget: float

    def __init__(self, check: Check, done: proc.Completed | None, budget: float) -> None:
        self.check = check
        self.done = done
        self.budget = budget


def gather(ctx: Context) -> Ran:
    spec = ctx.spec
    assert spec is not None and spec.dropin is not None
    check: Check = spec.dropin
    import time

    from probes import proc  # here, not at import: every run imports this module's caller

    budget = max(0.0, ctx.deadline - time.monotonic())
    if check.problem is not None:
        return Ran(check, None, budget)
    env = {**os.environ, "HEALTHCHECK_PROFILE": ctx.profile}
    done = proc.run([check.path], deadline=ctx.deadline, env=env, cwd="/")
    return Ran(check, done, budget)


def _perfdata(text: str) -> tuple[Any, str | None]:
    """(value, unit) of the first ``label=value[unit]`` item of Nagios performance data."""
    first = text.strip().split(" ")[0] if text.strip() else ""
    _, sep, rest = first.partition("=")
    if not sep:
        return None, None
    value = rest.split(";", 1)[0]
    unit = next((u for u in sorted(UNITS, key=len, reverse=True) if value.endswith(u)), None)
    number = value[: len(value) - len(unit)] if unit else value
    try:
        parsed = float(number)
    except ValueError:
        return None, None
    if parsed != parsed or parsed in (float("inf"), float("-inf")):
        return None, None
    return (int(parsed) if parsed.is_integer() and "." not in number else parsed), unit


def judge(data: Ran, ctx: Context) -> Result:
    check, done = data.check, data.done
    name = check.name
    if done is None and check.reason == "limit":
        return warned(name, f"not checked: {check.problem}", reason="limit")
    if done is None:
        what = "untrusted" if check.reason == "untrusted" else "not run"
        fix = f": {check.fix}" if check.reason == "untrusted" else ""
        return failed(name, f"{what}: {check.problem}{fix}", reason=check.reason)
    from probes import childio

    if childio.limited(done.spawn_error):
        # The limit is the container's, not the check's: no "#! line" to blame, nothing checked.
        return warned(name, f"not checked: {clean(check.path, 120)} {done.spawn_error}", reason="limit")
    if done.spawn_error:
        return failed(name, f"cannot start {clean(check.path, 120)} ({done.spawn_error}): give it a #! line "
                      "naming an installed interpreter", reason="cannot-start")
    first = done.stdout.split(b"\n", 1)[0].decode("utf-8", "replace")
    message, _, perf = first.partition("|")
    message = clean(" ".join(message.split()), MAX_MESSAGE)
    observed, unit = _perfdata(perf)
    if done.timed_out or done.stuck:
        return failed(name, f"no answer within {data.budget:.1f}s (deadline passed)"
                      + (f"; it said: {message}" if message else ""), reason="deadline")
    if done.signal is not None:
        from probes import proc

        sig = proc.signal_name(done.signal)
        return failed(name, f"killed by {sig}" + (f"; it said: "
                                                  f"{message}" if message else ""), reason="bad-exit")
    code = done.returncode
    said = message or f"exit {code} with no message"
    kw: dict[str, Any] = {"observed": observed, "unit": unit}
    if code == 0:
        return passed(name, said, **kw)
    if code == 1:
        return warned(name, said, reason="check-warning", **kw)
    if code == 2:
        return failed(name, said, reason="check-failed", **kw)
    if code == 3:
        return warned(name, f"unknown: {said}", reason="unknown", **kw)
    return failed(name, f"exit {code} is not a check result (0 pass, 1 warn, 2 fail, 3 unknown)"
                  + (f"; it said: {message}" if message else ""), reason="bad-exit")
