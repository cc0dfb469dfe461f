"""``Record``: the base of the suite's small value classes. A record's fields are its annotations in
order, a default the value in the class body; it gets ``__init__`` (positional or keyword), equality
and a hash by fields, a repr, ``_replace`` and ``_asdict``, and ``__post_init__`` runs when it has one."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, Self, dataclass_transform
else:
    def dataclass_transform(**_):  # the type checker's marker (PEP 681); nothing at run time
        return lambda cls: cls


@dataclass_transform()
class Record:
    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        own = [name for name, kind in vars(cls).get("__annotations__", {}).items()
               if "ClassVar[" not in str(kind)]
        cls._fields = (*cls._fields, *(name for name in own if name not in cls._fields))
        cls._defaults = {**cls._defaults, **{name: vars(cls)[name] for name in own if name in vars(cls)}}

    def __init__(self, *args: Any, **kw: Any) -> None:
        fields = self._fields
        given = dict(zip(fields, args))
        unknown = [name for name in kw if name not in fields or name in given]
        values = {**self._defaults, **given, **kw}
        if unknown or len(args) > len(fields) or len(values) < len(fields):
            why = f"an unexpected or repeated argument {unknown[0]!r}" if unknown else (
                f"{len(args)} arguments for {len(fields)} fields" if len(args) > len(fields) else
                f"no argument {next(name for name in fields if name not in values)!r}")
            raise TypeError(f"{type(self).__name__} got {why}")
        self.__dict__.update(values)
        if hasattr(self, "__post_init__"):
            self.__post_init__()

    def _asdict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}

    def _replace(self, **changes: Any) -> Self:
        return type(self)(**{**self._asdict(), **changes})

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._asdict() == other._asdict()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(tuple(self._asdict().values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"
