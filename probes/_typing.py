"""``NamedTuple`` without importing ``typing`` or ``collections`` at run time.

``typing`` (with the ``re``, ``contextlib`` and ``warnings`` it imports) costs every run
several milliseconds, liveness included, and ``collections`` (for ``namedtuple``, which also
compiles each class's ``__new__`` from source) about two more. The suite needs one thing
from either at run time: the class syntax of ``NamedTuple``. Modules import
``typing.NamedTuple`` when type checking and this one otherwise; here the same class syntax
builds a tuple subclass with the same fields, defaults, field access, ``_fields``,
``_field_defaults``, ``_make``, ``_replace``, ``_asdict``, repr, pickling, methods,
properties and docstring (tests/core/test_typing.py holds it to ``typing.NamedTuple``).
"""

try:
    from _collections import _tuplegetter as _getter  # what namedtuple itself uses
except ImportError:  # another Python: a property does the same, a little slower
    def _getter(index: int, doc: str) -> property:  # type: ignore[misc]
        from operator import itemgetter

        return property(itemgetter(index), doc=doc)

_SKIP = ("__annotations__", "__module__", "__qualname__", "__orig_bases__", "__dict__", "__weakref__")


def _new(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
    fields = cls._fields
    if len(args) == len(fields) and not kwargs:
        return tuple.__new__(cls, args)
    if len(args) > len(fields):
        raise TypeError(f"{cls.__name__}() takes {len(fields)} arguments, {len(args)} given")
    values = list(args)
    for name in fields[len(args):]:
        if name in kwargs:
            values.append(kwargs.pop(name))
        elif name in cls._field_defaults:
            values.append(cls._field_defaults[name])
        else:
            raise TypeError(f"{cls.__name__}() missing required argument: {name!r}")
    if kwargs:
        name = next(iter(kwargs))
        why = "got multiple values for" if name in fields else "got an unexpected keyword"
        raise TypeError(f"{cls.__name__}() {why} argument {name!r}")
    return tuple.__new__(cls, values)


def _make(cls, iterable):  # type: ignore[no-untyped-def]
    values = tuple(iterable)
    if len(values) != len(cls._fields):
        raise TypeError(f"expected {len(cls._fields)} arguments, got {len(values)}")
    return tuple.__new__(cls, values)


def _replace(self, **changes):  # type: ignore[no-untyped-def]
    values = [changes.pop(name, value) for name, value in zip(self._fields, self)]
    if changes:
        raise ValueError(f"got unexpected field names: {list(changes)!r}")
    return tuple.__new__(type(self), values)


def _asdict(self):  # type: ignore[no-untyped-def]
    return dict(zip(self._fields, self))


def _repr(self):  # type: ignore[no-untyped-def]
    return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self._fields, self))})"


def _getnewargs(self):  # type: ignore[no-untyped-def]
    return tuple(self)


class _Meta(type):
    def __new__(mcls, name, bases, ns):  # type: ignore[no-untyped-def]
        if not bases:  # NamedTuple itself
            return super().__new__(mcls, name, bases, ns)
        fields = tuple(ns.get("__annotations__", {}))
        defaults = {f: ns[f] for f in fields if f in ns}
        if any(f not in defaults for f in fields[len(fields) - len(defaults):]):
            raise TypeError(f"{name}: a field without a default follows one with a default")
        body = {"__slots__": (), "__doc__": ns.get("__doc__") or f"{name}({', '.join(fields)})",
                "__module__": ns.get("__module__"), "__qualname__": ns.get("__qualname__", name),
                "_fields": fields, "_field_defaults": defaults, "__match_args__": fields,
                "__new__": _new, "_make": classmethod(_make), "_replace": _replace, "_asdict": _asdict,
                "__repr__": _repr, "__getnewargs__": _getnewargs}
        for index, field in enumerate(fields):
            body[field] = _getter(index, f"Alias for field number {index}")
        for key, value in ns.items():
            if key not in _SKIP and key not in fields and key != "__doc__":
                body[key] = value
        return type.__new__(type, name, (tuple,), body)


class NamedTuple(metaclass=_Meta):
    """Base class: ``class Point(NamedTuple): x: int; y: int = 0``."""
