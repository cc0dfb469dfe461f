"""NVML events while serving: the real nvidia-ml-py bindings over the fake libnvidia-ml.so.1."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from probes import docs
from probes.hardware import xids
from probes.serve.cli import load
from probes.serve.monitor import severity
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
    (13, 48, {}),  # the catalog: 13 is the application's error, 48 needs a GPU reset
    (45, 109, {}),  # 45 follows another Xid; 109 is RESET_GPU (NVIDIA's device plugin ignores it)
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
    s = load(clean_env())[0]
    # a GPU reset or a restart of the machine in the catalog latches (its workflows for 48 and 74 too);
    # the application's Xids (maybe another tenant's) warn; IGNORE is counted; the rest warn
    latching = (79, 48, 74, 119, 140, 46, 62, 109, 110, 136, 143, 151, 155, 156, 158)
    assert [severity("xid", x, s) for x in latching] == ["critical"] * len(latching)
    assert [severity("xid", x, s) for x in (13, 31, 8, 94, 68)] == ["application"] * 5
    assert [severity("xid", x, s) for x in (43, 63, 92, 14, 137)] == ["no-action"] * 5
    assert [severity("xid", x, s) for x in (45, 54, 144, 149, 154, 159, 167, 1, 9999)] == ["other"] * 9
    assert xids.CATALOG[79].action == xids.RESTART_BM and xids.CATALOG[109].action == xids.RESET_GPU
    assert xids.CATALOG[43].action == xids.IGNORE and 9999 not in xids.CATALOG
    s = load(clean_env(HEALTHCHECK_XID_IGNORE="79,13"))[0]
    assert severity("xid", 79, s) == "ignored" and severity("xid", 13, s) == "ignored"
    # an operator's list replaces the catalog's: what it leaves out warns, never latches
    s = load(clean_env(HEALTHCHECK_XID_CRITICAL="43", HEALTHCHECK_XID_APPLICATION="79"))[0]
    assert [severity("xid", x, s) for x in (43, 79, 48, 13)] == ["critical", "application", "other", "other"]


def test_every_code_of_the_catalog_is_there_with_its_immediate_action():
    assert sorted(xids.CATALOG) == list(range(1, 173)) and "analyzing-xid-catalog" in xids.SOURCE
    assert all(x.action in xids.BUCKETS and x.mnemonic.isupper() and x.meaning for x in xids.CATALOG.values())
    # facts from the catalog that the first table got wrong or left out
    for code in (46, 62, 110, 136, 143, 155, 156, 158, 109):
        assert xids.CATALOG[code].action == xids.RESET_GPU, code
    assert xids.CATALOG[79].mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert (xids.CATALOG[74].action, xids.CATALOG[48].action, xids.CATALOG[45].action) == (
        xids.WORKFLOW_NVLINK_ERR, xids.WORKFLOW_XID_48, xids.WORKFLOW_XID_45)
    assert {xids.CATALOG[c].action for c in range(144, 151)} == {xids.WORKFLOW_NVLINK5_ERR}


def test_every_action_has_a_metric_label_and_the_latching_ones_are_reset_or_reboot():
    def label(xid: int) -> str:
        return xids.bucket(xid).label

    assert (label(79), label(48), label(74), label(109)) == (
        "reboot", "reset-gpu", "reset-gpu", "reset-gpu")
    assert (label(13), label(43), label(167), label(9999)) == (
        "restart-app", "ignore", "none-named", "unknown")
    # what the alert keys on (reset-gpu|reboot) is exactly what serve latches by default
    assert {x for x in xids.CATALOG if label(x) in ("reset-gpu", "reboot")} == {
        x for x in xids.CATALOG if xids.latches(x)}


def test_the_docs_list_every_code_with_its_action_and_each_action_with_its_reason():
    table = docs.xid_policy()
    for code, x in xids.CATALOG.items():
        assert f"| {code} | `{x.mnemonic}` |" in table
    assert "| 79 | `ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS` | `RESTART_BM` | latches unhealthy |" in table
    assert "| 43 | `ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR` | `IGNORE` | counted only |" in table
    assert "| 167 | `PCIE_FATAL_TIMEOUT` | (none given) | warns 10 min |" in table
    actions = docs.xid_actions()
    assert xids.SOURCE in actions
    for action, bucket in xids.BUCKETS.items():
        assert bucket.why in actions and (f"`{action}`" if action else "(none given)") in actions
    assert "| `RESTART_BM` | 79 | latches unhealthy |" in actions


@pytest.mark.parametrize(("xid", "sev", "words", "not_words"), [
    (54, "other", "check the GPU's seating and power connections", "application"),
    (144, "other", "the nvml probe reports a required reset", "application"),
    (13, "application", "restart the application", "reset"),
    (79, "critical", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: GPU has fallen off the bus; reboot the node", "?"),
    (43, "critical", "latched as HEALTHCHECK_XID_CRITICAL lists it", "none needed"),
    (9999, "other", "not in NVIDIA's Xid catalog; see NVIDIA's current Xid documentation", "application"),
])
def test_an_xid_says_what_the_catalog_calls_it_and_what_to_do(xid, sev, words, not_words):
    from probes.serve.view import XidEvent

    said = XidEvent(time=0.0, gpu=0, uuid="", kind="xid", data=xid, severity=sev).advice()
    assert words in said and not_words not in said
