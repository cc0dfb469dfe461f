"""probes._typing.NamedTuple behaves as typing.NamedTuple for everything the suite uses."""

from __future__ import annotations

import copy
import pickle
import typing

import pytest

from probes import _typing


def make(base: type) -> type:
    class Point(base):  # type: ignore[misc,valid-type]
        """A point."""

        x: int
        y: int = 2
        label: str = "p"

        @property
        def norm(self) -> int:
            return abs(self.x) + abs(self.y)

        def moved(self, dx: int) -> Point:
            return self._replace(x=self.x + dx)

    return Point


OURS, THEIRS = make(_typing.NamedTuple), make(typing.NamedTuple)
CALLS = [((1,), {}), ((1, 5), {}), ((1, 5, "q"), {}), ((), {"x": 3}), ((1,), {"label": "z"}),
         ((), {"y": 1, "x": 0}), ((), {}), ((1, 2, "a", 4), {}), ((1,), {"x": 2}), ((1,), {"nope": 1}),
         ((), {"y": 1})]


def outcome(cls: type, args: tuple, kwargs: dict) -> object:
    try:
        p = cls(*args, **kwargs)
    except TypeError:
        return TypeError
    return (tuple(p), p._asdict(), p.norm, tuple(p.moved(1)), repr(p).split("(", 1)[1])


@pytest.mark.parametrize("args, kwargs", CALLS)
def test_construction_and_methods_match_typing(args, kwargs):
    assert outcome(OURS, args, kwargs) == outcome(THEIRS, args, kwargs)


def test_the_class_matches_typing():
    assert OURS._fields == THEIRS._fields == ("x", "y", "label")
    assert OURS._field_defaults == THEIRS._field_defaults == {"y": 2, "label": "p"}
    assert OURS.__doc__ == THEIRS.__doc__ == "A point."
    assert OURS.__match_args__ == THEIRS.__match_args__
    assert OURS.__qualname__.endswith("make.<locals>.Point") and OURS.__module__ == __name__
    assert issubclass(OURS, tuple) and OURS.__slots__ == ()
    p = OURS(1)
    assert p.x == 1 and p[2] == "p" and p == (1, 2, "p") and hash(p) == hash((1, 2, "p"))
    assert OURS._make([4, 5, "m"]) == OURS(4, 5, "m")
    with pytest.raises(ValueError):
        p._replace(z=1)
    with pytest.raises(AttributeError):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p.other = 3  # type: ignore[attr-defined]


def test_copies_and_pickles_as_itself():
    from probes.result import Result, Status

    r = Result("ssh", Status.PASS, "fine", observed=1.5, facts={"a": 1})
    for twin in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert twin == r and type(twin) is Result and twin.status is Status.PASS


def test_a_field_without_default_after_one_with_is_refused():
    with pytest.raises(TypeError):
        class Bad(_typing.NamedTuple):
            a: int = 1
            b: int
