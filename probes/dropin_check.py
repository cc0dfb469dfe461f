"""The probe module every drop-in's spec names (found and trusted by probes/dropins.py, where its
causes are): its exit status, first line and performance data are the result."""

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

UNITS = ("us", "ms", "s", "%", "B", "KB", "MB", "GB", "TB", "c")  # Nagios performance data's


class Ran(Record):
    check: Check
    done: proc.Completed | None  # None: not run (check.problem says why)
    budget: float


def gather(ctx: Context) -> Ran:
    check: Check = ctx.spec.dropin  # type: ignore[union-attr]
    budget = ctx.remaining()
    if check.problem is not None:
        return Ran(check, None, budget)
    from probes import proc

    env = {**os.environ, "HEALTHCHECK_PROFILE": ctx.config.profile}
    return Ran(check, proc.run([check.path], deadline=ctx.deadline, env=env, cwd="/"), budget)


def _perfdata(text: str) -> tuple[Any, str | None]:
    """(value, unit) of the first ``label=value[unit]`` item of Nagios performance data."""
    rest = text.strip().split(" ")[0].partition("=")[2]
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
    check, done, name = data.check, data.done, data.check.name
    if done is None:
        assert check.cause is not None
        said = {dropins.UNTRUSTED: "untrusted", dropins.LIMIT: "not checked"}.get(check.cause, "not run")
        return verdict(name, check.cause, f"{said}: {check.problem}", remedy=check.cause != dropins.LIMIT)
    from probes import childio

    if childio.limited(done.spawn_error):  # the container's limit: no "#! line" to blame, nothing checked
        return verdict(name, dropins.LIMIT, f"not checked: {clean(check.path, 120)} {done.spawn_error}",
                       remedy=False)
    if done.spawn_error:
        return verdict(name, dropins.CANNOT_START,
                       f"cannot start {clean(check.path, 120)} ({done.spawn_error})")
    message, _, perf = done.stdout.split(b"\n", 1)[0].decode("utf-8", "replace").partition("|")
    message = clean(" ".join(message.split()), 200)
    said = f"; it said: {message}" if message else ""
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
    observed, unit = _perfdata(perf)
    if found is dropins.PASSED:
        return passed(name, text, observed=observed, unit=unit)
    return verdict(name, found, f"unknown: {text}" if found is dropins.UNKNOWN else text, remedy=False,
                   observed=observed, unit=unit)
