"""The result of one probe, and ``verdict``, where every message is built."""

from __future__ import annotations

import enum
import types

from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from probes.spec import Cause


class Status(enum.Enum):  # a probe's status; its value is what JSON and the metrics read
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


SEVERITY = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2}  # the worst result wins


class Result(Record):
    """One probe's outcome. ``message`` is one line, safe to show anywhere (no tokens, no exception
    text); ``facts`` is JSON-serialisable data for later probes and ``-v``; the runner fills in
    ``elapsed`` and ``time``."""

    name: str
    status: Status
    message: str
    observed: Any = None  # health+json's observedValue, with observedUnit ``unit``
    unit: str | None = None
    reason: str | None = None  # the cause's code ("gpu-lost"): what HTTP clients and metrics see
    facts: Mapping[str, Any] = types.MappingProxyType({})
    elapsed: float = 0.0
    time: float = 0.0
    action: str | None = None  # from the cause: how to act on it (probes.spec.ACTIONS)...
    actor: str | None = None  # ...and who can (tenant or operator)

    @property
    def ok(self) -> bool:
        return self.status in (Status.PASS, Status.WARN)

    def to_dict(self) -> dict[str, Any]:
        return {**self._asdict(), "status": self.status.value, "facts": dict(self.facts)}


def passed(name: str, message: str, **kw: Any) -> Result:
    return Result(name, Status.PASS, message, **kw)


def verdict(name: str, cause: Cause, detail: str, *, remedy: bool = True, **kw: Any) -> Result:
    """The cause's status, reason, action and actor; the message is ``detail``, then ``: `` and the
    remedy without its Markdown backticks (``remedy=False``: the detail alone, when it names the remedy)."""
    message = f"{detail}: {cause.remedy.replace('`', '')}" if remedy and cause.remedy else detail
    return Result(name, Status(cause.status), message, reason=cause.reason, action=cause.action,
                  actor=cause.actor, **kw)
