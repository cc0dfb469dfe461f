"""Running one drop-in check: the probe module that every drop-in's spec names.

What a drop-in is, how the directory is read and trusted, and the causes are in
``probes.dropins``; here the check is started through ``probes.proc.run`` and its exit
status, first line and performance data become the result.
"""

from __future__ import annotations

import os

from probes import dropins
from probes.record import Record
from probes.result import Result, passed, verdict
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
    env = {**os.environ, "HEALTHCHECK_PROFILE": ctx.config.profile}
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
    if done is None and check.cause == dropins.UNTRUSTED:
        return verdict(name, dropins.UNTRUSTED, f"untrusted: {check.problem}")
    if done is None and check.cause == dropins.LIMIT:
        return verdict(name, dropins.LIMIT, f"not checked: {check.problem}", remedy=False)
    if done is None:
        assert check.cause is not None
        return verdict(name, check.cause, f"not run: {check.problem}")
    from probes import childio

    if childio.limited(done.spawn_error):
        # The limit is the container's, not the check's: no "#! line" to blame, nothing checked.
        return verdict(name, dropins.LIMIT, f"not checked: {clean(check.path, 120)} {done.spawn_error}",
                       remedy=False)
    if done.spawn_error:
        return verdict(name, dropins.CANNOT_START,
                       f"cannot start {clean(check.path, 120)} ({done.spawn_error})")
    first = done.stdout.split(b"\n", 1)[0].decode("utf-8", "replace")
    message, _, perf = first.partition("|")
    message = clean(" ".join(message.split()), MAX_MESSAGE)
    said = f"; it said: {message}" if message else ""
    observed, unit = _perfdata(perf)
    if done.timed_out or done.stuck:
        return verdict(name, dropins.DEADLINE, f"no answer within {data.budget:.1f}s (deadline passed){said}")
    if done.signal is not None:
        from probes import proc

        return verdict(name, dropins.BAD_EXIT, f"killed by {proc.signal_name(done.signal)}{said}")
    code = done.returncode
    if code not in (0, 1, 2, 3):
        return verdict(name, dropins.BAD_EXIT, f"exit {code} is not a check result "
                       f"(0 pass, 1 warn, 2 fail, 3 unknown){said}")
    # The check's own first line is the message, and its own remedy: nothing is added to it.
    found = (dropins.PASSED, dropins.WARNING, dropins.FAILED, dropins.UNKNOWN)[code]
    text = message or f"exit {code} with no message"
    if found is dropins.PASSED:
        return passed(name, text, observed=observed, unit=unit)
    return verdict(name, found, f"unknown: {text}" if found is dropins.UNKNOWN else text, remedy=False,
                   observed=observed, unit=unit)
