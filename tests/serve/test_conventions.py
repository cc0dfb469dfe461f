"""Conventions on a real `healthcheck serve`: the Kubernetes API server's ?verbose,
/readyz/<check> and ?exclude=<check> (drop-in checks as the real probes that pass and fail),
and /metrics as Prometheus and OpenMetrics parsers read it."""

from __future__ import annotations

import http.client
import json
import platform
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from probes import __version__
from tests.serve.conftest import ALL_OFF, watch_env, write_exe

ALL = "# healthcheck: profiles=startup,readiness,liveness timeout=5\n"


def checks_dir(tmp_path: Path, bad: bool = True) -> Path:
    d = tmp_path / "checks"
    d.mkdir(mode=0o755)
    write_exe(d / "good", f"#!/bin/sh\n{ALL}echo 'model loaded | load=1.5s'\n")
    if bad:
        write_exe(d / "bad", f"#!/bin/sh\n{ALL}echo 'scratch volume full: free some space'\nexit 2\n")
    return d


def get(port: int, path: str, accept: str | None = None) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


@pytest.fixture
def srv(start_server, tmp_path: Path):
    s = start_server(dict(ALL_OFF, HEALTHCHECK_CHECKS_DIR=str(checks_dir(tmp_path))), "--interval", "0.5")
    s.wait_for("/readyz", lambda c, b: "bad:status" in b["checks"], 30, "the drop-ins ran")
    s.wait_for("/livez", lambda c, b: "bad:status" in b["checks"], 30, "the drop-ins ran")
    return s


@pytest.mark.parametrize("endpoint", ["livez", "readyz"])
def test_verbose_prints_one_line_per_check_then_the_verdict(srv, endpoint: str):
    code, ctype, text = get(srv.port, f"/{endpoint}?verbose")
    assert code == 503 and ctype == "text/plain; charset=utf-8"
    lines = text.splitlines()
    assert "[+]good ok" in lines and "[+]serve ok" in lines
    assert any(line.startswith("[-]bad failed: ") and "scratch volume full" in line for line in lines), lines
    assert lines[-1] == f"{endpoint} check failed"
    assert all(line.startswith(("[+]", "[-]")) for line in lines[:-1]), lines


def test_json_stays_the_default_and_wins_when_asked_for(srv):
    for path, accept in (("/readyz", None), ("/readyz?verbose", "application/health+json"),
                         ("/readyz?verbose=1", "application/json"),
                         ("/readyz/bad?verbose", "application/health+json")):
        code, ctype, body = get(srv.port, path, accept)
        assert code == 503 and ctype == "application/health+json", path
        assert json.loads(body)["status"] == "fail"


def test_one_check_alone_and_an_unknown_one(srv):
    code, _, body = get(srv.port, "/readyz/good")
    doc = json.loads(body)
    assert code == 200 and doc["status"] == "pass" and list(doc["checks"]) == ["good:status"]
    code, _, body = get(srv.port, "/readyz/bad")
    doc = json.loads(body)
    assert code == 503 and doc["status"] == "fail" and list(doc["checks"]) == ["bad:status"]
    assert get(srv.port, "/livez/good?verbose")[::2] == (200, "[+]good ok\nlivez check passed\n")
    code, ctype, body = get(srv.port, "/readyz/nope")
    doc = json.loads(body)
    assert code == 404 and ctype == "application/health+json"
    assert doc["status"] == "fail" and doc["reason"] == "not-found" and "good" in doc["output"]
    assert get(srv.port, "/readyz/")[0] == 404
    assert get(srv.port, "/metricsz/good")[0] == 404


def test_exclude_leaves_checks_out_and_says_what_it_could_not(srv):
    code, _, text = get(srv.port, "/readyz?verbose&exclude=bad")
    lines = text.splitlines()
    assert code == 200, text
    assert "[+]bad excluded: ok" in lines and lines[-1] == "readyz check passed"
    code, _, body = get(srv.port, "/readyz?exclude=bad&exclude=nope")
    doc = json.loads(body)
    assert code == 200 and doc["status"] == "pass" and "bad:status" not in doc["checks"]
    assert any('no matches for "nope"' in n for n in doc["notes"])
    code, _, text = get(srv.port, "/readyz?verbose&exclude=bad&exclude=nope")
    assert 'warn: some health checks cannot be excluded: no matches for "nope"' in text.splitlines()
    assert get(srv.port, "/readyz?exclude=good")[0] == 503
    code, _, text = get(srv.port, "/readyz?verbose&exclude=good&exclude=bad&exclude=serve")
    assert code == 200 and text.splitlines()[-1] == "readyz check passed"


def test_exclude_cannot_pass_a_result_that_is_not_there(start_server, tmp_path: Path):
    # The startup run never ends within the test: its endpoint stays "pending" whatever is excluded.
    hang = checks_dir(tmp_path, bad=False)
    write_exe(hang / "slow", "#!/bin/sh\n# healthcheck: profiles=startup timeout=60\nexec sleep 60\n")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_CHECKS_DIR=str(hang), HEALTHCHECK_TIMEOUT="90"),
                       "--interval", "0.5")
    for path in ("/startupz?exclude=serve", "/startupz/good", "/startupz?exclude=serve&exclude=good"):
        code, _, body = get(srv.port, path)
        doc = json.loads(body)
        assert code == 503 and doc["reason"] == "pending", (path, doc)


def _scrape(port: int, accept: str | None = None) -> tuple[str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


def _samples(families: Any, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in families for s in f.samples if s.name == name]


def test_metrics_parse_as_prometheus_text_and_openmetrics(start_server, fake_nvml, tmp_path: Path):
    srv = start_server(watch_env(fake_nvml, tmp_path, "gpus 2\ngpu 0 uuid GPU-0000-fake\ngpu 1 lost\n",
                                 ENABLE_GPU_CHECK="true"), "--interval", "0.5")
    srv.wait_for("/readyz", lambda c, b: "nvml:gpus" in b["checks"], 30, "a readiness run with nvml")
    ctype, text = _scrape(srv.port)
    assert ctype == CONTENT_TYPE_PLAIN_0_0_4  # what prometheus_client answers a client that asks nothing
    families = list(text_string_to_metric_families(text))
    info = _samples(families, "healthcheck_build_info")
    assert info == [({"version": __version__, "python": platform.python_version(), "torch": ""}, 1.0)]
    assert _samples(families, "healthcheck_latched") == [({}, 0.0)]  # one series, no labels
    assert _samples(families, "healthcheck_latch_info") == []
    gpus = {s["gpu"]: (s["UUID"], v) for s, v in _samples(families, "healthcheck_gpu_up")}
    assert gpus["0"] == ("GPU-0000-fake", 1.0) and gpus["1"][1] == 0.0, gpus

    ctype, text = _scrape(srv.port, "application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
    assert ctype.startswith("application/openmetrics-text")
    families = list(openmetrics_families(text))
    assert {f.name: f.type for f in families}["healthcheck_build"] == "info"
    assert _samples(families, "healthcheck_latched") == [({}, 0.0)]
    assert text.endswith("# EOF\n")


def test_a_latch_flips_the_one_series_and_names_its_source(start_server, fake_nvml, tmp_path: Path):
    srv = start_server(watch_env(fake_nvml, tmp_path, "gpus 2\ngpu 1 uuid GPU-1111-fake\nevent 1 xid 79 1500\n"),
                       "--interval", "0.5")
    srv.wait_for("/livez", lambda c, b: b.get("reason") == "xid-79", 30, "the Xid latches")
    families = list(text_string_to_metric_families(_scrape(srv.port)[1]))
    assert _samples(families, "healthcheck_latched") == [({}, 1.0)]
    assert _samples(families, "healthcheck_latch_info") == [({"source": "xid", "code": "xid-79"}, 1.0)]
    events = _samples(families, "healthcheck_nvml_events_total")
    assert ({"gpu": "1", "UUID": "GPU-1111-fake", "kind": "xid", "xid": "79", "severity": "critical",
             "action": "reboot"}, 1.0) in (
        events), events
