"""What serve's view guarantees of a child's report: rebuilt from known fields, every string one printable line."""

from __future__ import annotations

import json

from probes.serve.view import parse_report


def test_a_report_is_rebuilt_with_every_string_folded_to_one_printable_line():
    child = {"status": "fail", "output": "unhealthy:\n  gpu 0\t lost\x1b[2J", "notes": ["a\r\nb"], "extra": "dropped",
             "checks": {"nvml:gpus\n": [{"status": "fail", "output": "line one\nline two", "secret": "x"}]}}
    report = parse_report(json.dumps(child).encode())
    assert report is not None
    assert report["output"] == "unhealthy: gpu 0 lost\\x1b[2J"
    assert report["notes"] == ["a b"]
    assert report["checks"] == {"nvml:gpus": [{"status": "fail", "output": "line one line two"}]}
    assert "extra" not in report


def test_what_is_no_report_is_refused():
    for raw in (b"", b"healthy\n", b'{"status": "fine", "checks": {}}', b'{"status": "pass", "checks": []}'):
        assert parse_report(raw) is None
