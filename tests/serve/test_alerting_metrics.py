"""What the alerting rules read from a real `healthcheck serve`: the action each NVML event needs,
and the reason code of each check that is not passing (the fake NVML under the real bindings,
drop-in checks as real probes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import ALL_OFF, watch_env, write_exe

ALL = "# healthcheck: profiles=startup,readiness,liveness timeout=5\n"


def samples(srv: Any, name: str) -> list[dict[str, str]]:
    _, _, text = srv.get("/metrics")
    return [dict(s.labels, value=str(s.value)) for f in text_string_to_metric_families(text.decode())
            for s in f.samples if s.name == name]


def wait_samples(srv: Any, name: str, pred: Any, what: str, timeout: float = 30.0) -> list[dict[str, str]]:
    got: list[dict[str, str]] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = samples(srv, name)
        if pred(got):
            return got
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s; last {got}\nlog:\n{srv.log_text()}")


def test_event_counters_name_the_action_each_event_needs(start_server, fake_nvml, tmp_path: Path):
    # Xid 48 needs a GPU reset even where the operator ignores it: the action is the catalog's,
    # the severity is serve's policy. An Xid the catalog lacks is "unknown", never a reset.
    scenario = ("gpus 2\ngpu 1 uuid GPU-1111-fake\nevent 1 xid 48 300\nevent 0 xid 13 300\n"
                "event 0 xid 4242 300\nevent 0 ecc-double 1 300\nevent 0 ecc-single 1 300\nevent 1 xid 79 300\n")
    srv = start_server(watch_env(fake_nvml, tmp_path, scenario, HEALTHCHECK_XID_IGNORE="48"),
                       "--interval", "0.5")
    got = wait_samples(srv, "healthcheck_nvml_events_total", lambda s: len(s) == 6, "six kinds of event counted")
    actions = {(s["gpu"], s["kind"], s["xid"]): (s["action"], s["severity"], s["UUID"]) for s in got}
    assert actions[("1", "xid", "48")] == ("reset-gpu", "ignored", "GPU-1111-fake")
    assert actions[("1", "xid", "79")] == ("reboot", "critical", "GPU-1111-fake")
    assert actions[("0", "xid", "13")][:2] == ("restart-app", "application")
    assert actions[("0", "xid", "4242")][:2] == ("unknown", "other")
    assert actions[("0", "ecc-double", "")][:2] == ("reset-gpu", "critical")
    assert actions[("0", "ecc-single", "")][:2] == ("none", "corrected")
    assert srv.terminate() == 0


def test_probe_reason_holds_while_the_check_fails_and_goes_with_it(start_server, tmp_path: Path):
    checks = tmp_path / "checks"
    checks.mkdir(mode=0o755)
    write_exe(checks / "good", f"#!/bin/sh\n{ALL}echo 'model loaded'\n")
    flag = tmp_path / "broken"
    flag.write_text("")
    write_exe(checks / "scratch", f"#!/bin/sh\n{ALL}if [ -e {flag} ]; then echo 'scratch full'; exit 2; fi\n"
              "echo 'scratch ok'\n")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_CHECKS_DIR=str(checks)), "--interval", "0.3")

    def failing(s: list[dict[str, str]]) -> bool:
        return any(x["profile"] == "readiness" and x["probe"] == "scratch" for x in s)

    got = wait_samples(srv, "healthcheck_probe_reason", failing, "the failing check's reason")
    ready = [x for x in got if x["profile"] == "readiness"]
    # with who can act on it and how: the drop-in table's check-failed (exit 2) row
    assert {"profile": "readiness", "probe": "scratch", "reason": "check-failed", "action": "fix-config",
            "actor": "tenant", "value": "1.0"} in ready
    assert not [x for x in got if x["probe"] == "good"], got  # a passing check has no reason series
    flag.unlink()
    wait_samples(srv, "healthcheck_probe_reason", lambda s: not failing(s), "the reason goes when it passes")
    assert srv.terminate() == 0
