"""A regular expression compiled on first use, and a module imported on first use.

``re`` (and the compile) costs every run about 1-2 ms; most patterns in the probes are used
only on a failure path or by a probe that is not running. ``regex(p).search(...)`` behaves as
``re.compile(p).search(...)``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time (see probes/_typing.py)
if TYPE_CHECKING:
    import re
    from types import ModuleType


class regex:
    __slots__ = ("_compiled", "_flags", "_pattern")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self._pattern, self._flags = pattern, flags
        self._compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if self._compiled is None:
            import re

            self._compiled = re.compile(self._pattern, self._flags)
        return getattr(self._compiled, name)


class module:
    """A module imported on first attribute use: ``proc = module("probes.proc")``.

    Every run imports every probe module to read its declaration, liveness included, so what
    a probe needs only while it runs (process control, the NVML bindings, a worker's protocol)
    is reached through one of these: ``proc.run(...)`` imports ``probes.proc`` then. Modules
    name the real import under ``TYPE_CHECKING`` for the type checker.
    """

    __slots__ = ("_loaded", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._loaded: ModuleType | None = None

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if self._loaded is None:
            from probes.spec import load

            self._loaded = load(self._name)
        return getattr(self._loaded, name)
