"""``NamedTuple`` without importing ``typing`` at run time.

``typing`` (with the ``re``, ``contextlib`` and ``warnings`` it imports) costs every run
several milliseconds, liveness included, and the suite needs only one thing from it at run
time: the class syntax of ``NamedTuple``. Modules import ``typing.NamedTuple`` when type
checking and this one otherwise; here the same class syntax builds a
``collections.namedtuple`` with the same fields, defaults, methods, properties and docstring.
"""

import collections

_SKIP = ("__annotations__", "__module__", "__qualname__", "__orig_bases__", "__dict__", "__weakref__")


class _Meta(type):
    def __new__(mcls, name, bases, ns):  # type: ignore[no-untyped-def]
        if not bases:  # NamedTuple itself
            return super().__new__(mcls, name, bases, ns)
        fields = list(ns.get("__annotations__", {}))
        defaults = [ns[f] for f in fields if f in ns]
        cls = collections.namedtuple(name, fields, defaults=defaults or None, module=ns.get("__module__"))
        for key, value in ns.items():
            if key not in _SKIP and key not in fields:
                setattr(cls, key, value)
        cls.__qualname__ = ns.get("__qualname__", name)
        return cls


class NamedTuple(metaclass=_Meta):
    """Base class: ``class Point(NamedTuple): x: int; y: int = 0``."""
