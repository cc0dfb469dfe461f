"""The worker's one line is validated strictly; anything else is garbage (the pure part)."""

from __future__ import annotations

import copy
import json
import types
from typing import Any

import pytest

from probes.framework import deep, torch_cuda, torch_worker
from probes.result import Result, Status

GOOD: dict[str, Any] = {
    "v": torch_worker.SCHEMA, "device": "cuda", "size": torch_cuda.SIZE, "torch": "2.3.0", "cuda": "12.1",
    "cuda_built": True, "available": True, "count": 1, "visible_devices": None, "error": None,
    "devices": [{"index": 0, "name": "H100", "uuid": None, "op_ms": 0.5, "max_err": 1e-5, "scale": 150.0,
                 "free": 2**30, "total": 2**31, "error": None}],
}


def line(report: Any) -> bytes:
    return (torch_worker.PREFIX + json.dumps(report) + "\n").encode()


def parse(raw: bytes) -> tuple[Any, Any]:
    return deep.parse(raw, torch_worker.PREFIX, lambda report: torch_cuda.validate(report, "cuda", torch_cuda.SIZE))


def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    report = copy.deepcopy(GOOD)
    target = report
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return report


def test_a_good_line_among_noise_is_accepted() -> None:
    report, problem = parse(b"some noise\n" + line(GOOD) + b"more noise\n")
    assert problem is None and report == GOOD


@pytest.mark.parametrize(("raw", "problem"), [
    (b"", "no result line"),
    (b"PASS\n", "no result line"),
    (line(GOOD) + line(GOOD), "more than one result line"),
    (torch_worker.PREFIX.encode() + b"{not json\n", "not readable JSON"),
    (line(GOOD).replace(b'"max_err": 1e-05', b'"max_err": NaN'), "not readable JSON"),
    (line([1, 2]), "not an object"),
    (line(changed(("v",), torch_worker.SCHEMA + 1)), "schema version"),
    (line(changed(("device",), "cpu")), "another request"),
    (line(changed(("count",), True)), "wrong type"),
    (line(changed(("count",), 5)), "does not cover every device"),
    (line(changed(("torch",), KeyError)), "unexpected or missing fields"),
    (line({**GOOD, "status": "pass"}), "unexpected or missing fields"),
    (line(changed(("devices", 0, "max_err"), "0")), "wrong type"),
    (line(changed(("devices", 0, "max_err"), None)), "is missing"),
    (line(changed(("devices", 0, "extra"), 1)), "unexpected or missing fields"),
    (line(changed(("error",), {"phase": "init"})), "unexpected or missing fields"),
])
def test_anything_else_is_garbage(raw: bytes, problem: str) -> None:
    report, why = parse(raw)
    assert report is None and problem in why


@pytest.mark.parametrize("spelled", ["nan", "inf", "-inf"])
def test_not_a_number_is_a_wrong_result(spelled: str) -> None:
    # The worker spells a non-finite error as a string: strict JSON has no NaN.
    report, problem = parse(line(changed(("devices", 0, "max_err"), spelled)))
    assert problem is None
    data = {"kind": "worker", "python": "python3", "device": "cuda", "expect": None, "report": report}
    result = torch_cuda.judge(data, None)  # type: ignore[arg-type]
    assert result.status is Status.FAIL and result.reason == "wrong-result" and "not a number" in result.message


def test_the_worker_spells_non_finite_numbers_as_strict_json() -> None:
    assert [torch_worker.scaffold().measure(x) for x in (float("nan"), float("inf"), -float("inf"), 2.5)] == \
        ["nan", "inf", "-inf", 2.5]


BIG = "9" * 400  # an integer float() cannot hold


@pytest.mark.parametrize(("old", "new"), [
    (b'"max_err": 1e-05', b'"max_err": ' + BIG.encode()),
    (b'"free": 1073741824', b'"free": ' + BIG.encode()),
    (b'"op_ms": 0.5', b'"op_ms": 1e999'),
    (b'"scale": 150.0', b'"scale": -1e999'),
    (b'"count": 1', b'"count": Infinity'),
])
def test_numbers_too_large_for_a_float_are_unreadable(old: bytes, new: bytes) -> None:
    raw = line(GOOD)
    assert old in raw
    report, why = parse(raw.replace(old, new))
    assert report is None and why.startswith("the result line is not readable JSON")


@pytest.mark.parametrize(("path", "value", "problem"), [
    # What a parse could not produce but a damaged cache file can.
    (("devices", 0, "max_err"), 10**400, "not a finite number"),
    (("devices", 0, "op_ms"), float("inf"), "not a finite number"),
    (("devices", 0, "scale"), float("nan"), "not a finite number"),
    (("devices", 0, "max_err"), "NaN", "wrong type"),
    (("devices", 0, "free"), 2**70, "out of range"),
    (("count",), -(2**64), "out of range"),
])
def test_validation_takes_only_finite_bounded_numbers(path: tuple[Any, ...], value: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        torch_cuda.validate(changed(path, value), "cuda", torch_cuda.SIZE)


def test_strings_are_cleaned_where_the_report_enters() -> None:
    raw = changed(("torch",), "2.3\x00\x1b[2J\x07\nx")
    raw["devices"][0].update(name="H100\x1b]0;t\x07", uuid="GPU-1\n2")
    raw["error"] = None
    report, problem = parse(line(raw))
    assert problem is None
    assert report["torch"] == "2.3\\x00\\x1b[2J\\x07\\nx"
    assert report["devices"][0]["name"] == "H100\\x1b]0;t\\x07"
    assert report["devices"][0]["uuid"] == "GPU-1\\n2"
    # Cleaning is idempotent: a cached, cleaned report validates to itself.
    assert torch_cuda.validate(report, "cuda", torch_cuda.SIZE) == report
    err = {"phase": "device", "type": "Runtime\x1bError", "message": "boom\x00" * 200, "device": 0,
           "module": None, "code": None}
    report, problem = parse(line(changed(("devices", 0, "error"), err)))
    assert problem is None
    cleaned = report["devices"][0]["error"]
    assert cleaned["type"] == "Runtime\\x1bError"
    assert len(cleaned["message"]) <= torch_cuda.TEXT_LIMITS["message"] and "\x00" not in cleaned["message"]


def test_a_worker_that_lingered_fails_whatever_it_printed() -> None:
    report, _ = parse(line(GOOD))
    data = {"kind": "worker", "python": "python3", "device": "cuda", "expect": None, "report": report,
            "timed_out": True, "lingered": True, "stuck": False}
    result = torch_cuda.judge(data, None)  # type: ignore[arg-type]
    assert (result.status, result.reason) == (Status.FAIL, "lingered")
    assert "printed its result but did not exit within 1.0 s" in result.message
    assert "HEALTHCHECK_TORCH_PYTHON" in result.message
    data["stuck"] = True  # ... and survived SIGKILL: the wedged driver is the diagnosis
    assert torch_cuda.judge(data, None).reason == "stuck"  # type: ignore[arg-type]


def test_holder_names_from_nvml_are_cleaned() -> None:
    gpus = [{"index": 0, "uuid": None, "compute_mode": "EXCLUSIVE\x1b[1m_PROCESS",
             "processes": [{"pid": 4242, "name": "python\x1b[31m\ntrain.py"}, {"pid": "77\x07", "name": "x"}]}]
    ctx = types.SimpleNamespace(results={"nvml": Result("nvml", Status.PASS, "ok", facts={"gpus": gpus})})
    err = {"phase": "device", "type": "RuntimeError", "message": "CUDA-capable device(s) is/are busy or "
           "unavailable", "device": 0, "module": None, "code": None}
    report, _ = parse(line(changed(("devices", 0, "error"), err)))
    data = {"kind": "worker", "python": "python3", "device": "cuda", "expect": None, "report": report}
    result = torch_cuda.judge(data, ctx)  # type: ignore[arg-type]
    assert result.reason == "device-busy"
    assert ("EXCLUSIVE\\x1b[1m_PROCESS compute mode; held by pid 4242 "
            "(python\\x1b[31m\\ntrain.py))") in result.message, result.message  # a pid that is no number: left out
    assert result.message.isprintable()


@pytest.mark.parametrize("when", [float("inf"), 1e300, "x", None, -5])
def test_a_damaged_latch_time_is_unknown_not_a_crash(when: Any) -> None:
    data = deep.latched({"source": "torch\x1b-cuda", "reason": "fatal\x00\nerror", "time": when})
    result = torch_cuda.judge(data, None)  # type: ignore[arg-type]
    assert result.reason == "latched" and "since an unknown time" in result.message
    assert result.message.isprintable() and "fatal\\x00\\nerror" in result.message


def test_phase_markers_are_validated() -> None:
    def last(stderr: bytes) -> str | None:
        return deep.last_phase(stderr, torch_worker.PHASE, torch_cuda.PHASES)

    assert last(b"HEALTHCHECK-TORCH-PHASE import\nHEALTHCHECK-TORCH-PHASE device 3\n") == "device 3"
    assert last(b"HEALTHCHECK-TORCH-PHASE import\nHEALTHCHECK-TORCH-PHASE \x1b[2J evil\n") == "import"


def test_worker_and_parent_agree_on_the_protocol() -> None:
    args = torch_worker.parse_args(["--device", "cuda", "--size", str(torch_cuda.SIZE)])
    empty = torch_worker.new_report(args)
    assert set(empty) == set(GOOD)


def test_an_earlier_stuck_worker_holds_back_the_next() -> None:
    data = {"kind": "worker", "python": "python3", "device": "cuda", "expect": None, "report": None,
            "stuck": True, "held_by": 4242, "phase": None}
    result = torch_cuda.judge(data, None)  # type: ignore[arg-type]
    assert result.status is Status.FAIL and result.reason == "stuck"
    assert "earlier torch worker (pid 4242) is still stuck" in result.message
