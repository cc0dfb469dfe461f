"""The monitoring overlay: the HTTP overlay plus a PodMonitor and the alerting rules as a
PrometheusRule, rendered by kustomize; broken copies fail the policy with a line that says why."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
import yaml

from probes import __version__
from tests.k8s.conftest import K8S
from tests.k8s.test_manifests import render

MONITORING = K8S / "overlays" / "monitoring"


def test_the_overlay_adds_a_podmonitor_and_the_rules_to_the_http_variant() -> None:
    docs = render(MONITORING)
    assert sorted(d["kind"] for d in docs) == ["Deployment", "PodMonitor", "PrometheusRule", "Service"]
    [http_dep] = [d for d in render(K8S / "overlays" / "http") if d["kind"] == "Deployment"]
    assert [d for d in docs if d["kind"] == "Deployment"] == [http_dep]
    [monitor] = [d for d in docs if d["kind"] == "PodMonitor"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "health" and endpoint["path"] == "/metrics"
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    rules = yaml.safe_load((K8S / "alerting" / "rules.yaml").read_text())
    assert rule["spec"]["groups"] == rules["groups"]
    for d in docs:
        assert d["metadata"]["labels"]["app.kubernetes.io/version"] == __version__, d["kind"]


def _edit(k8s_copy: Path, name: str, change: Callable[[dict[str, Any]], None]) -> Path:
    path = k8s_copy / "overlays" / "monitoring" / name
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return k8s_copy / "overlays" / "monitoring"


def _endpoint(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["podMetricsEndpoints"][0]


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("podmonitor.yaml", lambda d: _endpoint(d).update(port="jupyter"),
     "port 'jupyter' is not where healthcheck serve answers"),
    ("podmonitor.yaml", lambda d: _endpoint(d).update(path="/metricz"), "path '/metricz'"),
    ("podmonitor.yaml", lambda d: _endpoint(d).pop("relabelings"),
     'the alerting rules select job="healthcheck"'),
    ("podmonitor.yaml", lambda d: d["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/name": "x"}),
     "select no pod template"),
    ("podmonitor.yaml", lambda d: d["metadata"]["labels"].pop("app.kubernetes.io/part-of"),
     "lacks the recommended labels app.kubernetes.io/part-of"),
    ("prometheusrule.yaml", lambda d: d["spec"]["groups"][0]["rules"][0]["annotations"].pop("runbook_url"),
     "alert HealthcheckCudaContextPoisoned lacks runbook_url"),
    ("prometheusrule.yaml", lambda d: d["spec"]["groups"][0]["rules"][1]["labels"].update(severity="page"),
     "alert HealthcheckXidNeedsResetOrReboot has no severity label"),
])
def test_a_broken_monitoring_object_is_named(checker: ModuleType, k8s_copy: Path, name: str,
                                              change: Callable[[dict[str, Any]], None], expected: str) -> None:
    problems = checker.check(_edit(k8s_copy, name, change))
    assert any(expected in p for p in problems), problems
