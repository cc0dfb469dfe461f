"""probes.framework.protocol: the one reading side of every worker's output."""

from __future__ import annotations

import pytest

from probes.framework import checkpoint_child, model_worker, nccl_worker, protocol, torch_worker

PREFIXES = [w.PREFIX for w in (torch_worker, model_worker, nccl_worker, checkpoint_child)]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_one_result_line_is_read_and_anything_else_is_refused(prefix):
    line = f"{prefix}{{\"v\": 1}}\n".encode()
    assert protocol.result(b"noise\n" + line + b"more noise\n", prefix) == {"v": 1}
    for out, why in ((b"noise only\n", "no result line"), (line + line, "more than one result line"),
                     (f"{prefix}{{not json\n".encode(), "not readable JSON"),
                     (f"{prefix}[NaN]\n".encode(), "not readable JSON")):
        with pytest.raises(protocol.Bad, match=why):
            protocol.result(out, prefix)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_result_has_arrived_only_with_its_line_break(prefix):
    assert not protocol.arrived(b"", prefix)
    assert not protocol.arrived(f"{prefix}{{\"v\": 1".encode(), prefix)  # still being written
    assert not protocol.arrived(f"say {prefix}{{}}\n".encode(), prefix)  # not at a line start
    assert protocol.arrived(f"start\n{prefix}{{\"v\": 1}}\n".encode(), prefix)
    assert protocol.arrived(f"{prefix}{{}}\r\n".encode(), prefix)


def test_the_last_valid_phase_is_where_the_worker_stopped():
    phase = torch_worker.PHASE
    err = f"{phase}start\n{phase}import\nwarning\n{phase}\x1b[2J evil\n".encode()
    assert protocol.last_phase(err, phase, r"start|import|init") == "import"
    assert protocol.last_phase(b"nothing\n", phase, r"start") is None


@pytest.mark.parametrize("value, kind, ok", [
    ("x", protocol.STR, True), ("x" * (protocol.MAX_STR + 1), protocol.STR, False), (1, protocol.STR, False),
    (True, protocol.BOOL, True), (1, protocol.BOOL, False),
    (3, protocol.INT, True), (True, protocol.INT, False), (2**63, protocol.INT, False), (1.0, protocol.INT, False),
    (1.5, protocol.NUM, True), (10**400, protocol.NUM, False), ("nan", protocol.NUM, False),
    ("nan", protocol.MEASURE, True), ("-inf", protocol.MEASURE, True), ("big", protocol.MEASURE, False),
])
def test_field_kinds(value, kind, ok):
    if ok:
        protocol.check(value, kind, False, "f")
    else:
        with pytest.raises(protocol.Bad):
            protocol.check(value, kind, False, "f")


def test_fields_are_exactly_the_schema():
    spec = {"a": (protocol.INT, False), "b": (protocol.STR, True)}
    protocol.fields({"a": 1, "b": None}, spec, "r")
    for obj, why in (([], "not an object"), ({"a": 1}, "unexpected or missing"),
                     ({"a": 1, "b": None, "c": 0}, "unexpected or missing"), ({"a": None, "b": "x"}, "r.a is missing")):
        with pytest.raises(protocol.Bad, match=why):
            protocol.fields(obj, spec, "r")


def test_nested_fields_must_be_there_and_are_left_to_the_caller():
    spec = {"a": (protocol.INT, False)}
    protocol.fields({"a": 1, "error": {"anything": [1]}}, spec, "r", nested=("error",))
    for obj in ({"a": 1}, {"a": 1, "error": None, "c": 0}):
        with pytest.raises(protocol.Bad, match="unexpected or missing"):
            protocol.fields(obj, spec, "r", nested=("error",))
