"""The worker's one line is validated strictly; anything else is garbage (the pure part)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from probes.framework import torch_cuda
from probes.result import Status

GOOD: dict[str, Any] = {
    "v": 1, "device": "cuda", "size": torch_cuda.SIZE, "expect_count": None, "torch": "2.3.0", "cuda": "12.1",
    "cuda_built": True, "available": True, "count": 1, "visible_devices": None, "error": None,
    "devices": [{"index": 0, "name": "H100", "uuid": None, "op_ms": 0.5, "max_err": 1e-5, "scale": 150.0,
                 "free": 2**30, "total": 2**31, "error": None}],
}


def line(report: Any) -> bytes:
    return (torch_cuda.PREFIX + json.dumps(report) + "\n").encode()


def parse(raw: bytes) -> tuple[Any, Any]:
    return torch_cuda.parse_output(raw, "cuda", torch_cuda.SIZE)


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
    (torch_cuda.PREFIX.encode() + b"{not json\n", "not JSON"),
    (line([1, 2]), "not an object"),
    (line(changed(("v",), 2)), "schema version"),
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


def test_not_a_number_is_a_wrong_result() -> None:
    raw = torch_cuda.PREFIX.encode() + json.dumps(changed(("devices", 0, "max_err"), float("nan"))).encode()
    report, _ = parse(raw)
    data = {"kind": "worker", "python": "python3", "device": "cuda", "expect": None, "report": report}
    result = torch_cuda.judge(data, None)  # type: ignore[arg-type]
    assert result.status is Status.FAIL and result.reason == "wrong-result" and "not a number" in result.message


def test_phase_markers_are_validated() -> None:
    assert torch_cuda.last_phase(b"HEALTHCHECK-TORCH-PHASE import\nHEALTHCHECK-TORCH-PHASE device 3\n") == \
        "device 3"
    assert torch_cuda.last_phase(b"HEALTHCHECK-TORCH-PHASE import\nHEALTHCHECK-TORCH-PHASE \x1b[2J evil\n") == \
        "import"


def test_worker_and_parent_agree_on_the_protocol() -> None:
    from probes.framework import torch_worker

    assert torch_worker.PREFIX == torch_cuda.PREFIX and torch_worker.SCHEMA == torch_cuda.SCHEMA
    args = torch_worker.parse_args(["--device", "cuda", "--size", str(torch_cuda.SIZE)])
    empty = torch_worker.new_report(args)
    assert set(empty) == set(GOOD)


def test_an_earlier_stuck_worker_holds_back_the_next() -> None:
    data = {"kind": "worker", "python": "python3", "device": "cuda", "expect": None, "report": None,
            "stuck": True, "held_by": 4242, "phase": None}
    result = torch_cuda.judge(data, None)  # type: ignore[arg-type]
    assert result.status is Status.FAIL and result.reason == "stuck"
    assert "earlier torch worker (pid 4242) is still stuck" in result.message
