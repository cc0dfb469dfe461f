"""``Record``: the base of the suite's small value classes (a result, a declaration, gathered data).

Each record is a plain class: its fields are its ``__slots__``, annotated in the class body,
and its own ``__init__`` takes them in that order. The base adds what the code asks of such
a value: equality and a hash by fields, a readable repr, ``_replace`` (a copy with some
fields changed) and ``_asdict``. Records are values: derive another with ``_replace``
rather than assigning to a field. Cheap to import (the liveness path reads records).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Self


class Record:
    __slots__: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.__slots__])

    def _asdict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def _replace(self, **changes: Any) -> Self:
        new = object.__new__(type(self))
        for name in self.__slots__:
            setattr(new, name, changes.pop(name) if name in changes else getattr(self, name))
        if changes:
            raise TypeError(f"{type(self).__name__} has no field {next(iter(changes))!r}")
        return new

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"
