"""The result of one probe: a small frozen value. Only the CLI picks the exit code."""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping

TYPE_CHECKING = False  # typing is not imported at run time (see probes/_typing.py)
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from probes._typing import NamedTuple


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


# Severity used to fold many results into one verdict: the worst wins.
SEVERITY = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2}


NO_FACTS: Mapping[str, Any] = types.MappingProxyType({})


class Result(NamedTuple):
    """One probe's outcome.

    ``message`` is one line, safe to show anywhere (no tokens, no exception text).
    ``observed``/``unit`` feed the JSON report's observedValue/observedUnit.
    ``facts`` carries machine-readable data for later probes (e.g. the NVML device
    count for torch-cuda) and for ``-v``; it must be JSON-serialisable.
    ``elapsed`` and ``time`` are filled in by the runner (``result._replace(...)``).
    A NamedTuple, not a dataclass: every probe run imports this, and dataclasses
    costs several milliseconds of start-up.
    """

    name: str
    status: Status
    message: str
    observed: Any = None
    unit: str | None = None
    # A short machine-readable cause ("not-found", "deadline", "gpu-lost", ...), the
    # only detail of a failure that HTTP clients and metrics see besides the message.
    reason: str | None = None
    facts: Mapping[str, Any] = NO_FACTS
    elapsed: float = 0.0
    time: float = 0.0

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
        kw = {k: v for k, v in d.items() if k in cls._fields}
        kw["status"] = Status(kw["status"])
        return cls(**kw)


def passed(name: str, message: str, **kw: Any) -> Result:
    return Result(name, Status.PASS, message, **kw)


def warned(name: str, message: str, **kw: Any) -> Result:
    return Result(name, Status.WARN, message, **kw)


def failed(name: str, message: str, **kw: Any) -> Result:
    return Result(name, Status.FAIL, message, **kw)


def skipped(name: str, message: str, **kw: Any) -> Result:
    return Result(name, Status.SKIP, message, **kw)
