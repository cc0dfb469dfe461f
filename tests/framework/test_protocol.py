"""The workers' protocol as the suite reads it (probes/framework/deep.py), for every worker's output."""

from __future__ import annotations

import pytest

from probes.framework import checkpoint_child, deep, model_worker, nccl_worker, torch_worker

PREFIXES = [w.PREFIX for w in (torch_worker, model_worker, nccl_worker, checkpoint_child)]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_one_result_line_is_read_and_anything_else_is_refused(prefix):
    line = f"{prefix}{{\"v\": 1}}\n".encode()
    assert deep.result(b"noise\n" + line + b"more noise\n", prefix) == {"v": 1}
    for out, why in ((b"noise only\n", "no result line"), (line + line, "more than one result line"),
                     (f"{prefix}{{not json\n".encode(), "not readable JSON"),
                     (f"{prefix}[NaN]\n".encode(), "not readable JSON")):
        with pytest.raises(deep.Bad, match=why):
            deep.result(out, prefix)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_result_has_arrived_only_with_its_line_break(prefix):
    assert not deep.arrived(b"", prefix)
    assert not deep.arrived(f"{prefix}{{\"v\": 1".encode(), prefix)  # still being written
    assert not deep.arrived(f"say {prefix}{{}}\n".encode(), prefix)  # not at a line start
    assert deep.arrived(f"start\n{prefix}{{\"v\": 1}}\n".encode(), prefix)
    assert deep.arrived(f"{prefix}{{}}\r\n".encode(), prefix)


def test_the_last_valid_phase_is_where_the_worker_stopped():
    phase = torch_worker.PHASE
    err = f"{phase}start\n{phase}import\nwarning\n{phase}\x1b[2J evil\n".encode()
    assert deep.last_phase(err, phase, r"start|import|init") == "import"
    assert deep.last_phase(b"nothing\n", phase, r"start") is None


@pytest.mark.parametrize("value, kind, ok", [
    ("x", deep.STR, True), ("x" * (deep.MAX_STR + 1), deep.STR, False), (1, deep.STR, False),
    (True, deep.BOOL, True), (1, deep.BOOL, False),
    (3, deep.INT, True), (True, deep.INT, False), (2**63, deep.INT, False), (1.0, deep.INT, False),
    (1.5, deep.NUM, True), (10**400, deep.NUM, False), ("nan", deep.NUM, False),
    ("nan", deep.MEASURE, True), ("-inf", deep.MEASURE, True), ("big", deep.MEASURE, False),
])
def test_field_kinds(value, kind, ok):
    if ok:
        deep.check(value, kind, False, "f")
    else:
        with pytest.raises(deep.Bad):
            deep.check(value, kind, False, "f")


def test_fields_are_exactly_the_schema():
    spec = {"a": "int", "b": "str?"}
    deep.fields({"a": 1, "b": None}, spec, "r")
    for obj, why in (([], "not an object"), ({"a": 1}, "unexpected or missing"),
                     ({"a": 1, "b": None, "c": 0}, "unexpected or missing"), ({"a": None, "b": "x"}, "r.a is missing")):
        with pytest.raises(deep.Bad, match=why):
            deep.fields(obj, spec, "r")


def test_nested_objects_and_lists_are_checked_field_by_field():
    spec = {"a": "int", "error": {"kind": "str"}, "items": [{"n": "int"}]}
    deep.fields({"a": 1, "error": None, "items": []}, spec, "r")
    deep.fields({"a": 1, "error": {"kind": "x"}, "items": [{"n": 1}, {"n": 2}]}, spec, "r")
    for obj, why in (({"a": 1, "items": []}, "r has unexpected or missing"),
                     ({"a": 1, "error": {"kind": 1}, "items": []}, "r.error.kind has the wrong type"),
                     ({"a": 1, "error": {}, "items": []}, "r.error has unexpected or missing"),
                     ({"a": 1, "error": None, "items": {"n": 1}}, "r.items is not a list"),
                     ({"a": 1, "error": None, "items": [{"n": 1}] * (deep.MAX_ITEMS + 1)}, "r.items is not a list"),
                     ({"a": 1, "error": None, "items": [{"n": 1}, {"n": None}]}, r"r.items\[1\].n is missing")):
        with pytest.raises(deep.Bad, match=why):
            deep.fields(obj, spec, "r")
