"""The result of one probe: a small frozen value. Only the CLI picks the exit code."""

from __future__ import annotations

import types

from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, ClassVar

    from probes.spec import Cause

class Status(str):
    """A probe's status: ``pass``, ``warn``, ``fail`` or ``skip``, each one object, compared by ``is``.

    A ``str`` with the value as its text, like the JSON it becomes. Not an ``enum.Enum``:
    ``enum`` costs every run, liveness included, ~1.5 ms of start-up (see make bench).
    ``Status("fail") is Status.FAIL``; any other text raises ValueError.
    """

    __slots__ = ()
    PASS: ClassVar[Status]
    WARN: ClassVar[Status]
    FAIL: ClassVar[Status]
    SKIP: ClassVar[Status]

    def __new__(cls, value: str) -> Status:
        try:
            return _MEMBERS[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not a valid Status") from None

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<Status.{self.value.upper()}>"

    def __reduce__(self) -> tuple[type[Status], tuple[str]]:
        return Status, (self.value,)


_MEMBERS: dict[str, Status] = {}
for _value in ("pass", "warn", "fail", "skip"):
    _MEMBERS[_value] = str.__new__(Status, _value)
    setattr(Status, _value.upper(), _MEMBERS[_value])
del _value


# Severity used to fold many results into one verdict: the worst wins.
SEVERITY = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2}


NO_FACTS: Mapping[str, Any] = types.MappingProxyType({})


class Result(Record):
    """One probe's outcome.

    ``message`` is one line, safe to show anywhere (no tokens, no exception text).
    ``observed``/``unit`` feed the JSON report's observedValue/observedUnit.
    ``facts`` carries machine-readable data for later probes (e.g. the NVML device
    count for torch-cuda) and for ``-v``; it must be JSON-serialisable.
    ``elapsed`` and ``time`` are filled in by the runner (``result._replace(...)``).
    """

    __slots__ = ("name", "status", "message", "observed", "unit", "reason", "facts", "elapsed", "time",
                 "action", "actor")

    name: str
    status: Status
    message: str
    observed: Any
    unit: str | None
    # A short machine-readable cause ("not-found", "deadline", "gpu-lost", ...), the
    # only detail of a failure that HTTP clients and metrics see besides the message.
    reason: str | None
    facts: Mapping[str, Any]
    elapsed: float
    time: float
    # Who can act on the cause (tenant or operator) and how: from the catalog, set by verdict().
    action: str | None
    actor: str | None

    def __init__(self, name: str, status: Status, message: str, observed: Any = None, unit: str | None = None,
                 reason: str | None = None, facts: Mapping[str, Any] = NO_FACTS, elapsed: float = 0.0,
                 time: float = 0.0, action: str | None = None, actor: str | None = None) -> None:
        self.name = name
        self.status = status
        self.message = message
        self.observed = observed
        self.unit = unit
        self.reason = reason
        self.facts = facts
        self.elapsed = elapsed
        self.time = time
        self.action = action
        self.actor = actor

    @property
    def ok(self) -> bool:
        return self.status in (Status.PASS, Status.WARN)

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["status"] = self.status.value
        d["facts"] = dict(self.facts)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Result:
        kw = {k: v for k, v in d.items() if k in cls.__slots__}
        kw["status"] = Status(kw["status"])
        return cls(**kw)


def passed(name: str, message: str, **kw: Any) -> Result:
    return Result(name, Status.PASS, message, **kw)


def failed(name: str, message: str, **kw: Any) -> Result:
    return Result(name, Status.FAIL, message, **kw)


def verdict(name: str, cause: Cause, detail: str, *, remedy: bool = True, **kw: Any) -> Result:
    """The result a cause of the catalog gives: its status, reason, action and actor, and the
    message built in this one place: the ``detail`` the probe observed, then ``: `` and the
    cause's remedy without its Markdown backticks (``remedy=False``: the detail alone, for a
    cause whose remedy the detail already names)."""
    message = f"{detail}: {cause.remedy.replace('`', '')}" if remedy and cause.remedy else detail
    return Result(name, Status(cause.status), message, reason=cause.reason, action=cause.action,
                  actor=cause.actor, **kw)
