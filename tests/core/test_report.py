"""Reports: the verdict first, every line for a probe, under 4096 bytes, health+json shape."""

from __future__ import annotations

import json

from probes import report
from probes.result import Result, Status
from probes.runner import Outcome


def outcome(*results: Result, notes: tuple[str, ...] = ()) -> Outcome:
    return Outcome("readiness", tuple(results), notes)


def r(name: str, status: Status, msg: str = "fine", **kw) -> Result:
    return Result(name, status, msg, time=1.7e9, **kw)


def test_verdict_names_first_failure_and_remedy():
    out = report.text(outcome(r("ssh", Status.PASS), r("jupyter", Status.FAIL, "refused: start it"),
                              r("nvml", Status.FAIL, "later")))
    first, *rest = out.splitlines()
    assert first == "unhealthy: jupyter: refused: start it"
    assert rest[0].startswith("PASS ssh ") and rest[1].startswith("FAIL jupyter ")


def test_warn_and_pass_verdicts():
    assert report.text(outcome(r("nvml", Status.WARN, "thermal slowdown"))).startswith(
        "healthy with warnings: nvml: thermal slowdown")
    assert report.text(outcome(r("ssh", Status.PASS))).startswith("healthy: readiness: 1 checks passed (ssh)")
    assert report.text(outcome(), disabled="all checks disabled").startswith("healthy: all checks disabled")


def test_output_is_cut_under_4096_bytes_keeping_the_verdict():
    huge = "é" * 5000
    results = [r(f"p{i}", Status.FAIL, huge) for i in range(40)]
    out = report.text(outcome(*results, notes=("n" * 5000,)), verbose=True)
    assert len(out.encode()) < 4096
    assert out.startswith("unhealthy: p0: ")
    assert out.endswith(report.CUT)


def test_multiline_messages_stay_on_one_line():
    out = report.text(outcome(r("ssh", Status.FAIL, "a\nb\r\nc")))
    assert out.splitlines()[1].endswith("a b c")


def test_health_json_shape():
    doc = report.health_json(outcome(
        r("nvidia-smi", Status.PASS, "2 GPUs", observed=2, unit="GPUs"),
        r("torch-cuda", Status.SKIP, "skipped: the hardware layer failed", reason="dependency-failed")))
    assert doc["status"] == "pass"
    assert set(doc) >= {"status", "version", "description", "output", "checks", "time", "profile"}
    key = next(k for k in doc["checks"] if k.startswith("nvidia-smi:"))
    check = doc["checks"][key][0]
    assert check["status"] == "pass" and check["observedValue"] == 2 and check["observedUnit"] == "GPUs"
    assert check["componentType"] == "system" and check["layer"] == "hardware"
    assert check["time"] == "2023-11-14T22:13:20.000Z"
    assert "output" not in check and check["message"] == "2 GPUs"  # the draft: no output for pass
    # A skipped probe observed nothing: not a check (neither pass nor warn), a note and "skipped".
    assert not any(k.startswith("torch-cuda:") for k in doc["checks"])
    assert any(n.startswith("torch-cuda not checked: skipped: the hardware") for n in doc["notes"])
    assert next(v for k, v in doc["skipped"].items() if k.startswith("torch-cuda:"))["reason"] == (
        "dependency-failed")
    json.loads(report.json_text(outcome()))


def test_health_json_value_and_unit_come_together_and_failures_have_output():
    doc = report.health_json(outcome(r("ssh", Status.PASS, "OpenSSH", observed="OpenSSH_9.2"),
                                     r("jupyter", Status.FAIL, "refused: start it", reason="refused"),
                                     r("nvml", Status.WARN, "hot", observed=2)))
    ssh, jupyter, nvml = (next(v[0] for k, v in doc["checks"].items() if k.startswith(n + ":"))
                          for n in ("ssh", "jupyter", "nvml"))
    assert ssh["observedUnit"] == "text" and nvml["observedUnit"] == "count"
    assert "observedValue" not in jupyter and "observedUnit" not in jupyter
    assert jupyter["output"] == "refused: start it" and nvml["output"] == "hot"
    assert {c["componentType"] for c in (ssh, jupyter)} == {"component"}


def test_control_characters_that_reach_a_result_are_escaped_in_every_form():
    """The boundary cleans outside text; the report is the last line of defence for anything missed."""
    raw = "bad\x1b[2J\x07\x00\nname\u202e"
    r = Result("ssh", Status.FAIL, raw, observed=raw, unit="u\x1b", reason="x", time=1.0)
    outcome = Outcome("readiness", (r,), notes=(raw,))
    for out in (report.text(outcome, verbose=True), report.json_text(outcome)):
        assert not any(ch in out for ch in "\x1b\x07\x00\u202e"), out
    text = report.text(outcome, verbose=True)
    assert "bad\\x1b[2J\\x07\\x00 name\\u202e" in text
    assert len(text.splitlines()) == 3  # the verdict, one probe line, one note: no injected line
