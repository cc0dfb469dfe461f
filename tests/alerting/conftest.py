"""Helpers for the alerting tests: the shipped rules, Debian's Prometheus tools, and what serve exports."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from probes import registry
from probes.hardware import xids
from probes.hardware.nvml_lib import EVENT_KINDS
from probes.serve import PROFILES, httpd
from probes.serve.cli import load
from probes.serve.monitor import severity
from tests.conftest import ROOT
from tests.serve.conftest import fake_nvml, start_server  # noqa: F401  (fixtures used here)

ALERTING = ROOT / "k8s" / "alerting"
RULES = ALERTING / "rules.yaml"
RULE_TESTS = ALERTING / "rules.test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
# The labels a scrape adds: job and instance always; namespace, pod and container from a
# PodMonitor (or the kubernetes_sd relabeling in docs/alerting.md).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container"}
INSTALL = "install Debian's prometheus and prometheus-alertmanager (bash tests/setup-system.sh, as root)"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not found: {INSTALL}")
    return path


def rules(path: Path = RULES) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r]


def label_domains() -> dict[str, set[str]]:
    """Every value serve can give the labels the rules match on, from the code that gives them."""
    defaults = load({})[0]
    ignoring = load({"HEALTHCHECK_XID_IGNORE": "79"})[0]
    kinds = [kind for _, kind in EVENT_KINDS]  # what the NVML event watch reports
    xid_values = [*xids.CATALOG, 4242]  # every catalog entry, and one the catalog lacks
    severities = {severity(kind, x, s) for kind in kinds for x in xid_values for s in (defaults, ignoring)}
    actions = {httpd.action(kind, str(x) if kind == "xid" else "") for kind in kinds for x in xid_values}
    return {"profile": set(PROFILES), "status": set(httpd.STATUSES), "state": set(httpd.WATCHER_STATES),
            "kind": set(kinds), "severity": severities, "action": actions,
            "source": {"xid", *registry.NAMES}}
