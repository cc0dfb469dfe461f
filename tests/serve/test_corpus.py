"""Real Xid lines (tests/corpus/xid) through serve's severity, then as NVML events to a real serve."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from probes.serve.cli import load as serve_settings
from probes.serve.monitor import severity
from tests.conftest import clean_env
from tests.corpus import Sample, load
from tests.serve.conftest import marked_pids, watch_env

SAMPLES = load("xid")
XID_LINE = re.compile(rb"NVRM: Xid \((?:PCI:)?[0-9A-Fa-f:.]+\): (\d+),")
SEVERITIES = {"latch": {"critical"}, "warn": {"application", "other"}, "count": {"no-action"}}
EVENT = re.compile(r'^healthcheck_nvml_events_total\{(.*)\} ([0-9.]+)$')


def xid_of(sample: Sample) -> int:
    m = XID_LINE.search(sample.body)
    assert m, f"{sample.name}: no Xid line"
    return int(m[1])


def counted(metrics: str) -> Counter[tuple[int, str]]:
    """(xid, severity) -> events counted, from /metrics."""
    out: Counter[tuple[int, str]] = Counter()
    for line in metrics.splitlines():
        m = EVENT.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
            if labels.get("kind") == "xid":
                out[int(labels["xid"]), labels["severity"]] += int(float(m[2]))
    return out


def test_the_xid_corpus_is_real_and_covers_every_verdict():
    assert len(SAMPLES) >= 12 and all(s.source.startswith("https://") for s in SAMPLES)
    assert {s.expect for s in SAMPLES} == set(SEVERITIES)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_a_real_xid_line_gets_what_the_catalog_says(sample: Sample):
    assert severity("xid", xid_of(sample), serve_settings(clean_env())[0]) in SEVERITIES[sample.expect]


def test_real_xid_lines_as_nvml_events_latch_warn_or_count_in_a_real_serve(start_server, fake_nvml, tmp_path):
    events = "".join(f"event 0 xid {xid_of(s)} {300 + 150 * i}\n" for i, s in enumerate(SAMPLES))
    srv = start_server(watch_env(fake_nvml, tmp_path, "gpus 1\n" + events), "--interval", "0.5")
    want = Counter(xid_of(s) for s in SAMPLES)
    deadline = time.monotonic() + 30
    while True:
        _, _, metrics = srv.get("/metrics")
        seen = counted(metrics.decode())
        if all(sum(n for (x, _), n in seen.items() if x == xid) >= k for xid, k in want.items()):
            break
        assert time.monotonic() < deadline, f"events not all counted: {seen} {srv.log_text()[-2000:]}"
        time.sleep(0.2)
    for s in SAMPLES:
        sevs = {sev for (x, sev) in seen if x == xid_of(s)}
        assert sevs and sevs <= SEVERITIES[s.expect], (s.name, sevs)
    first = next(xid_of(s) for s in SAMPLES if s.expect == "latch")
    _, body = srv.wait_for("/readyz", lambda c, b: c == 503, 20, "the first latching Xid latches")
    assert body["reason"] == f"xid-{first}" and body["checks"]["latch:state"][0]["status"] == "fail"
    assert srv.terminate() == 0
    assert not marked_pids(srv.marker)
