"""The shipped alerting rules: promtool checks them and runs their unit tests, every alert has a
firing case and a quiet one (inside its `for:` window when it has one), each links a runbook
section, and every metric, label and label value they name is one a real `healthcheck serve`
exports (the fake NVML under the real bindings, a drop-in check as a real failing probe)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.alerting import promql
from tests.alerting.conftest import RULE_TESTS, RULES, RUNBOOK, TARGET_LABELS, label_domains, rules, tool
from tests.conftest import ROOT
from tests.fakes.nvidia_smi_stub import write_stub
from tests.serve.conftest import Server, watch_env, write_exe

GENERATOR = ROOT / "k8s" / "alerting" / "prometheusrule.py"
ALL = "# healthcheck: profiles=startup,readiness,liveness timeout=5\n"


def seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(int(n) * units[u] for n, u in parts)


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_runs_the_rules_unit_tests() -> None:
    done = subprocess.run([tool("promtool"), "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                          timeout=120, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_and_stays_quiet_in_its_for_window() -> None:
    groups = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    for rule in rules():
        name, hold = rule["alert"], seconds(rule.get("for", "0s"))
        cases = [(g["name"], seconds(c["eval_time"]), bool(c["exp_alerts"]))
                 for g in groups for c in g.get("alert_rule_test", []) if c["alertname"] == name]
        assert any(fires for _, _, fires in cases), f"{name}: no case where it fires"
        assert any(g == "healthy" and not fires for g, _, fires in cases), f"{name}: no healthy case"
        if hold:
            # Firing at t means its condition held since t - for: quiet at a time after that is
            # quiet inside the window.
            assert any(gq == gf and not quiet and fires and 0 < tf - tq < hold
                       for gq, tq, quiet in cases for gf, tf, fires in cases), (
                f"{name}: no quiet case inside its {rule['for']} window before a firing one")


def slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (lower case, punctuation dropped, - for spaces)."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_each_alert_links_its_own_runbook_section() -> None:
    text = RUNBOOK.read_text()
    anchors = {slug(h): h for h in re.findall(r"^#{2,3} (.+)$", text, re.M)}
    seen = set()
    for rule in rules():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page.endswith("/docs/runbook.md") and anchor in anchors, (rule["alert"], url)
        assert anchor not in seen, f"{rule['alert']} shares its runbook section"
        seen.add(anchor)
        section = text.split(f"## {anchors[anchor]}\n", 1)[1].split("\n## ", 1)[0]
        assert rule["alert"] in section, f"the {anchor} section does not name {rule['alert']}"
        for part in ("What it means", "How to confirm", "What to do"):
            assert f"**{part}.**" in section, f"the {anchor} section has no '{part}'"


# --- what serve exports ------------------------------------------------------------------------

def _scrape(srv: Server, into: dict[str, set[str]]) -> dict[str, set[str]]:
    for family in text_string_to_metric_families(srv.get("/metrics")[2].decode()):
        for s in family.samples:
            into.setdefault(s.name, set(TARGET_LABELS)).update(s.labels)
    return into


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, set[str]]:
    """metric -> label names, from a real serve whose every family has had a sample: two GPUs
    (one lost), a corrected ECC event, then a critical Xid that latches, a passing and a failing
    drop-in check.

    The GPUs' families come from runs before the latch and leave with it (the GPU is not touched
    while latched), the latch's only come after it: the Xid is due when the scrapes have seen the
    GPUs (the fake delivers it once a file exists), and the scrapes' union is what serve exports.
    """
    fake = request.getfixturevalue("fake_nvml")
    tmp = tmp_path_factory.mktemp("exported")
    checks = tmp / "checks"
    checks.mkdir(mode=0o755)
    write_exe(checks / "model", f"#!/bin/sh\n{ALL}echo 'model loaded'\n")
    write_exe(checks / "scratch", f"#!/bin/sh\n{ALL}echo 'scratch full'\nexit 2\n")
    write_stub(tmp / "bin", "ok", gpus=2)
    xid_now = tmp / "xid-now"
    env = watch_env(fake, tmp, f"gpus 2\ngpu 1 lost\nevent 0 ecc-single 1 300\nevent 0 xid 79 @{xid_now}\n",
                    ENABLE_GPU_CHECK="true", HEALTHCHECK_CHECKS_DIR=str(checks),
                    PATH=f"{tmp / 'bin'}:/usr/bin:/bin")
    srv = Server(tmp, env, ["--interval", "0.5"])
    every = len(re.findall(r"^# TYPE healthcheck_", srv.get("/metrics")[2].decode(), re.M))  # empty ones too
    seen: dict[str, set[str]] = {"up": set(TARGET_LABELS)}
    try:
        end = time.monotonic() + 30
        while len(got := {n for n in _scrape(srv, seen) if n.startswith("healthcheck_")}) < every:
            assert time.monotonic() < end, f"families with a sample: {sorted(got)}\n{srv.log_text()}"
            if "healthcheck_gpu_up" in got:
                xid_now.touch()
            time.sleep(0.2)
        return seen
    finally:
        srv.terminate()
        srv.cleanup()


def rule_problems(rule_list: list[dict[str, Any]], exported: dict[str, set[str]]) -> list[str]:
    domains = label_domains()
    return [p for r in rule_list for p in promql.problems(r["alert"], r["expr"], exported, domains,
                                                          r["annotations"].values())]


def test_the_rules_name_only_what_serve_exports(exported: dict[str, set[str]]) -> None:
    assert rule_problems(rules(), exported) == []


def test_the_rule_tests_feed_only_series_serve_exports(exported: dict[str, set[str]]) -> None:
    domains = label_domains()
    problems = [p for g in yaml.safe_load(RULE_TESTS.read_text())["tests"] for s in g["input_series"]
                for p in promql.problems(g["name"], s["series"], exported, domains)]
    assert problems == []


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("healthcheck_gpu_up == 0", "healthcheck_gpus_up == 0", "metric healthcheck_gpus_up is not exported"),
    ('{action=~"reset-gpu|reboot", severity!="ignored"}[1h]', '{actions=~"reset-gpu|reboot"}[1h]',
     "healthcheck_nvml_events_total has no label actions"),
    ('healthcheck_healthy{profile="readiness"} == 0', 'healthcheck_healthy{profile="ready"} == 0',
     "no series has profile='ready'"),
    ('action=~"reset-gpu|reboot", severity!="ignored"}[1h]', 'action=~"reset|reboot", severity!="ignored"}[1h]',
     "no series has action='reset'"),
    ("({{ $labels.UUID }}) does not answer", "({{ $labels.uuid }}) does not answer",
     "an annotation uses $labels.uuid"),
    ('`healthcheck_probe_reason{profile="readiness",job', '`healthcheck_probe_reasons{profile="readiness",job',
     "(template query): metric healthcheck_probe_reasons is not exported"),
    ("on (job, instance, profile)", "on (job, instance, profil)", "grouping by profil"),
])
def test_a_rule_that_names_something_serve_lacks_is_caught(exported: dict[str, set[str]], tmp_path: Path,
                                                           old: str, new: str, expected: str) -> None:
    text = RULES.read_text()
    assert old in text
    broken = tmp_path / "rules.yaml"
    broken.write_text(text.replace(old, new, 1))
    found = rule_problems(rules(broken), exported)
    assert any(expected in p for p in found), found


# --- the PrometheusRule -------------------------------------------------------------------------

def test_the_prometheusrule_is_rendered_from_the_rule_file() -> None:
    done = subprocess.run([sys.executable, str(GENERATOR)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    target = ROOT / "k8s" / "overlays" / "monitoring" / "prometheusrule.yaml"
    doc = yaml.safe_load(target.read_text())
    assert doc["kind"] == "PrometheusRule" and doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_a_stale_prometheusrule_is_one_line_exit_1(tmp_path: Path) -> None:
    """The generator's own check, on a copy of the tree whose rule file changed."""
    copy = tmp_path / "repo"
    for rel in ("k8s/alerting", "k8s/overlays/monitoring"):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(ROOT / rel), str(copy / rel)], check=True)
    (copy / "probes").mkdir()
    (copy / "probes" / "__init__.py").write_text((ROOT / "probes" / "__init__.py").read_text())
    rules_copy = copy / "k8s" / "alerting" / "rules.yaml"
    rules_copy.write_text(rules_copy.read_text().replace("for: 10m", "for: 15m"))
    done = subprocess.run([sys.executable, str(copy / "k8s" / "alerting" / "prometheusrule.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout.count("\n") == 1, done.stdout + done.stderr
    assert "prometheusrule.py --write" in done.stdout
