"""NVML events while serving: the real nvidia-ml-py bindings over the fake libnvidia-ml.so.1."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from probes import docs
from probes.hardware import xids
from probes.serve import settings as serve_settings
from probes.serve.xid import severity
from tests.conftest import ROOT, clean_env
from tests.serve.conftest import PYTHON, marked_pids, watch_env


def _counted(metrics: str, **labels: str) -> bool:
    """One healthcheck_nvml_events_total sample with these labels (among others) and the value 1."""
    return any(line.startswith("healthcheck_nvml_events_total{") and line.endswith(" 1.0")
               and all(f'{k}="{v}"' in line for k, v in labels.items()) for line in metrics.splitlines())


def test_critical_xid_latches_unhealthy_naming_xid_and_gpu(start_server, fake_nvml, tmp_path):
    scenario = "gpus 2\ngpu 1 uuid GPU-1111-fake\nevent 1 xid 79 2500\n"
    srv = start_server(watch_env(fake_nvml, tmp_path, scenario), "--interval", "0.5")
    srv.wait_for("/readyz", lambda c, b: c == 200, 20, "readiness passes before the event")
    code, body = srv.wait_for("/readyz", lambda c, b: c == 503, 20, "the Xid turns readiness 503")
    assert body["reason"] == "xid-79"
    assert "Xid 79" in body["output"] and "GPU 1" in body["output"] and "GPU-1111-fake" in body["output"]
    assert body["checks"]["latch:state"][0]["status"] == "fail"
    code, body = srv.health("/livez")
    assert code == 503 and body["reason"] == "xid-79"
    latch = json.loads((srv.state / "latch.json").read_text())
    assert latch["source"] == "xid" and "Xid 79" in latch["reason"]
    _, _, metrics = srv.get("/metrics")
    text = metrics.decode()
    assert "healthcheck_latched 1.0" in text and 'source="xid"' in text
    assert _counted(text, gpu="1", kind="xid", severity="critical", xid="79")
    assert srv.terminate() == 0
    assert not marked_pids(srv.marker)


def test_application_xid_only_warns(start_server, fake_nvml, tmp_path):
    srv = start_server(watch_env(fake_nvml, tmp_path, "gpus 1\nevent 0 xid 13 300\n"), "--interval", "0.5")
    code, body = srv.wait_for("/readyz", lambda c, b: "xid:events" in b["checks"], 20, "the Xid shows")
    assert code == 200 and body["status"] == "warn"
    entry = body["checks"]["xid:events"][0]
    assert entry["status"] == "warn" and entry["reason"] == "xid-13" and "GPU 0" in entry["output"]
    time.sleep(1.0)  # two more monitor runs: still not latched
    code, body = srv.health("/readyz")
    assert code == 200 and body["checks"]["latch:state"][0]["status"] == "pass"
    assert not (srv.state / "latch.json").exists()
    assert srv.terminate() == 0


@pytest.mark.parametrize(("warns", "latches", "lists"), [
    (43, 48, {}),  # the catalog: 43 is the application's error, 48 needs a GPU reset
    (79, 13, {"HEALTHCHECK_XID_CRITICAL": "13", "HEALTHCHECK_XID_APPLICATION": "79"}),  # the operator's call
])
def test_an_application_xid_warns_and_a_critical_one_latches(start_server, fake_nvml, tmp_path, warns, latches,
                                                             lists):
    env = watch_env(fake_nvml, tmp_path, f"gpus 1\nevent 0 xid {warns} 300\nevent 0 xid {latches} 2000\n",
                    **lists)
    srv = start_server(env, "--interval", "0.5")
    code, body = srv.wait_for("/readyz", lambda c, b: "xid:events" in b["checks"], 20, f"Xid {warns} warns")
    assert code == 200 and body["checks"]["xid:events"][0]["reason"] == f"xid-{warns}"
    code, body = srv.wait_for("/readyz", lambda c, b: c == 503, 20, f"Xid {latches} latches")
    assert body["reason"] == f"xid-{latches}"
    assert srv.terminate() == 0


def test_nvml_unavailable_is_said_once_and_serving_goes_on(start_server, fake_nvml, tmp_path):
    srv = start_server(watch_env(fake_nvml, tmp_path, "init-error 12\n"), "--interval", "0.3")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _, _, metrics = srv.get("/metrics")
        if b'healthcheck_nvml_event_watch{state="unavailable"} 1.0' in metrics:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"watcher never reported unavailable: {srv.log_text()}")
    _, body = srv.wait_for("/readyz", lambda c, b: c == 200, 20, "readiness still passes")
    assert any("event watching is off" in n for n in body["notes"])
    time.sleep(1.0)
    assert srv.log_text().count("NVML events unavailable (nvml-not-found)") == 1
    assert srv.terminate() == 0
    assert not marked_pids(srv.marker)


def test_xid_ignore_stops_79_from_latching_and_still_counts_it(start_server, fake_nvml, tmp_path):
    env = watch_env(fake_nvml, tmp_path, "gpus 1\nevent 0 xid 79 300\nevent 0 xid 13 1500\n",
                    HEALTHCHECK_XID_IGNORE="79")
    srv = start_server(env, "--interval", "0.5")
    code, body = srv.wait_for("/readyz", lambda c, b: "xid:events" in b["checks"], 20, "Xid 13 shows")
    assert code == 200 and body["checks"]["xid:events"][0]["reason"] == "xid-13"
    _, _, metrics = srv.get("/metrics")
    assert _counted(metrics.decode(), gpu="0", kind="xid", severity="ignored", xid="79")
    assert body["checks"]["latch:state"][0]["status"] == "pass" and not (srv.state / "latch.json").exists()
    assert srv.terminate() == 0


@pytest.mark.parametrize(("env", "needle"), [
    ({"HEALTHCHECK_XID_IGNORE": "79,x"}, "HEALTHCHECK_XID_IGNORE"),
    ({"HEALTHCHECK_XID_IGNORE": "0"}, "HEALTHCHECK_XID_IGNORE"),
    ({"HEALTHCHECK_XID_IGNORE": "48", "HEALTHCHECK_XID_CRITICAL": "48"}, "HEALTHCHECK_XID_IGNORE"),
])
def test_bad_xid_ignore_exits_3(env, needle):
    r = subprocess.run([PYTHON, "-m", "probes", "serve"], cwd=ROOT, env=clean_env(**env), capture_output=True,
                       text=True, timeout=30, check=False)
    assert r.returncode == 3 and needle in r.stderr and "Traceback" not in r.stderr, r


def test_the_catalog_decides_what_latches():
    s = serve_settings.load(clean_env())
    # a reset or a reboot in the catalog latches; the application's Xids (maybe another tenant's) do not
    assert [severity("xid", x, s) for x in (79, 48, 119, 140)] == ["critical"] * 4
    assert [severity("xid", x, s) for x in (13, 31, 43, 45, 8)] == ["application"] * 5
    assert severity("xid", 9999, s) == "other"
    assert xids.resolution(79) == xids.REBOOT and xids.resolution(13) == xids.RESTART_APP
    s = serve_settings.load(clean_env(HEALTHCHECK_XID_IGNORE="79,13"))
    assert severity("xid", 79, s) == "ignored" and severity("xid", 13, s) == "ignored"
    assert "| 79 | reboot the node | latches unhealthy |" in docs.xid_policy()
    assert "| 13 | restart the application | counted, warns for 10 min |" in docs.xid_policy()
