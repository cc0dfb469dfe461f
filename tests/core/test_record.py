"""Records (probes/record.py): the value behaviour the suite's code relies on, on real records."""

import ast
import pathlib

import pytest

from probes import record
from probes.result import Result, Status, failed, passed
from probes.runner import Outcome
from probes.spec import Cause, Setting

PROBES = pathlib.Path(record.__file__).parent


def test_replace_derives_a_new_value_and_refuses_unknown_fields():
    r = failed("nvml", "GPU 0 lost", reason="gpu-lost", facts={"count": 1})
    later = r._replace(elapsed=0.25, time=12.0)
    assert (later.elapsed, later.time) == (0.25, 12.0)
    assert (r.elapsed, r.time) == (0.0, 0.0)  # the original is untouched
    assert later._replace(elapsed=0.0, time=0.0) == r
    with pytest.raises(TypeError, match="'elapsed_s'"):
        r._replace(elapsed_s=1.0)


def test_asdict_lists_the_fields_in_constructor_order_and_round_trips():
    r = passed("ssh", "sshd answered", observed=1, unit="servers", elapsed=0.01)
    d = r.to_dict()
    assert list(d) == ["name", "status", "message", "observed", "unit", "reason", "facts", "elapsed", "time",
                       "action", "actor"]
    assert d["status"] == "pass"
    assert Result.from_dict(d) == r


def test_equality_and_hash_are_by_type_and_fields():
    a, b = Cause("x", "fail", "what", "fix", "retry", "tenant"), Cause("x", "fail", "what", "fix", "retry", "tenant")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Cause("x", "warn", "what", "fix", "retry", "tenant")
    assert a != ("x", "fail", "what", "fix")  # a record is not a tuple
    assert Outcome("liveness", (passed("a", "ok"),)) == Outcome("liveness", (passed("a", "ok"),))


def test_repr_names_every_field():
    s = Setting("HEALTHCHECK_X", "x", "bool", True, "a switch")
    assert repr(s).startswith("Setting(env='HEALTHCHECK_X', field='x', kind='bool', default=True, ")
    assert repr(Status.FAIL) in repr(failed("n", "m"))


def test_every_record_declares_its_slots_in_constructor_order():
    """_asdict, _replace, equality and repr read __slots__: it must list __init__'s parameters in order."""
    checked = 0
    for path in PROBES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "Record" for b in node.bases)):
                continue
            slots = next(ast.literal_eval(s.value) for s in node.body if isinstance(s, ast.Assign)
                         and getattr(s.targets[0], "id", "") == "__slots__")
            init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
            params = tuple(a.arg for a in (*init.args.args[1:], *init.args.kwonlyargs))
            assert slots == params, f"{path.name}: {node.name}"
            checked += 1
    assert checked >= 20
