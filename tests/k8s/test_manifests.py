"""The Kubernetes manifests render, validate offline against the shipped schemas, and follow
the probe policy; broken copies of them fail with a message that names the problem."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from probes import __version__, deadlines, registry
from probes.deadlines import probe_timeout_floor
from probes.spec import PROFILE_RULES
from tests.k8s.conftest import K8S, ROOT, container

KUBECTL = Path(sys.executable).parent / "kubectl"
CLI = [sys.executable, str(K8S / "check_probes.py")]
RENDERED = ("k8s", "k8s/base", "k8s/overlays/http", "k8s/overlays/monitoring")


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def deployment(path: Path) -> dict[str, Any]:
    [dep] = [d for d in render(path) if d["kind"] == "Deployment"]
    return dep


# --- the real manifests ------------------------------------------------------------------------

@pytest.mark.parametrize("rel", RENDERED)
def test_real_manifests_pass(checker: ModuleType, rel: str) -> None:
    assert checker.check(ROOT / rel) == []


def test_base_shape() -> None:
    docs = render(K8S / "base")
    assert sorted(d["kind"] for d in docs) == ["Deployment", "Service"]
    dep = deployment(K8S / "base")
    pod = dep["spec"]["template"]["spec"]
    c = container(dep)
    assert dep["spec"]["replicas"] == 1
    assert pod["runtimeClassName"] == "nvidia"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    [svc] = [d for d in docs if d["kind"] == "Service"]
    assert {(p["name"], p["port"]) for p in svc["spec"]["ports"]} == {("jupyter", 8888), ("ssh", 22)}
    for field, profile in (("startupProbe", "startup"), ("readinessProbe", "readiness"),
                           ("livenessProbe", "liveness")):
        assert c[field]["exec"]["command"] == ["healthcheck", "--profile", profile]
        assert c[field]["timeoutSeconds"] >= probe_timeout_floor(PROFILE_RULES[profile].timeout)


def test_every_written_version_is_the_suites() -> None:
    """The release version (probes/__init__.py) is also written in the manifests' version labels and
    image tag: they must all say the same (the image's label: tests/e2e/test_image.py)."""
    docs = render(K8S / "base")
    labels = [d["metadata"]["labels"]["app.kubernetes.io/version"] for d in docs]
    assert labels == [__version__] * len(docs)
    assert container(deployment(K8S / "base"))["image"].endswith(f":{__version__}")


def test_http_overlay_replaces_every_handler() -> None:
    c = container(deployment(K8S / "overlays" / "http"))
    for field, path in (("startupProbe", "/startupz"), ("readinessProbe", "/readyz"),
                        ("livenessProbe", "/livez")):
        assert "exec" not in c[field], f"{field} kept the base's exec handler"
        assert c[field]["httpGet"] == {"path": path, "port": "health"}
    assert {"name": "health", "containerPort": 8779, "protocol": "TCP"} in c["ports"]
    # The image's entrypoint starts and supervises serve; no unsupervised postStart shell.
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["HEALTHCHECK_SERVE"] == "true" and env["HEALTHCHECK_SERVE_PORT"] == "8779"
    assert env["HEALTHCHECK_SERVE_HOST"] == "0.0.0.0"
    assert "lifecycle" not in c and "command" not in c


def test_cli_passes_on_the_real_manifests() -> None:
    done = subprocess.run(CLI, capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok: ") == 3


def test_validation_needs_no_network(checker: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The schemas ship with kubernetes-validate: any connection attempt would fail the test."""
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the validation tried to use the network")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for rel in RENDERED[1:]:
        assert checker.check(ROOT / rel) == []


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare(1) to run the CLI in a namespace without a network")
def test_cli_passes_without_a_network() -> None:
    """kubectl kustomize and the validation in a network namespace with only a down loopback."""
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("unshare -n is not permitted here (a container without CAP_SYS_ADMIN)")
    done = subprocess.run(["unshare", "-n", *CLI], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# --- broken copies -------------------------------------------------------------------------------

def test_missing_timings(checker: ModuleType, edit_deployment: Any) -> None:
    def change(c: dict[str, Any]) -> None:
        c["readinessProbe"].pop("timeoutSeconds")
        c["livenessProbe"].pop("periodSeconds")
    problems = checker.check(edit_deployment(change))
    floor = probe_timeout_floor(PROFILE_RULES["readiness"].timeout)
    assert any("readinessProbe: has no timeoutSeconds" in p and f"at least {floor}" in p for p in problems), problems
    assert any("livenessProbe: has no periodSeconds" in p for p in problems), problems


def test_misspelt_field_is_a_schema_error(checker: ModuleType, edit_deployment: Any) -> None:
    def typo(c: dict[str, Any]) -> None:
        c["livenessProbe"]["timeoutSecond"] = c["livenessProbe"].pop("timeoutSeconds")
    problems = checker.check(edit_deployment(typo))
    assert any("spec.template.spec.containers.0.livenessProbe" in p and "'timeoutSecond' was unexpected" in p
               for p in problems), problems
    assert any("livenessProbe: has no timeoutSeconds" in p for p in problems), problems


def test_wrong_type_is_a_schema_error(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(lambda c: c["startupProbe"].update(failureThreshold="many")))
    assert any("startupProbe.failureThreshold" in p and "'many' is not of type" in p for p in problems), problems


def test_unknown_field_on_the_container(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(lambda c: c.update(readinessProbes=c["readinessProbe"])))
    assert any("containers.0: Additional properties are not allowed ('readinessProbes' was unexpected)" in p
               for p in problems), problems


def test_the_timeout_floor_is_read_from_the_deadline_ladder(checker: ModuleType, monkeypatch) -> None:
    """The policy asks probes.deadlines, which the front door's margins live in: it cannot drift."""
    floor = deadlines.probe_timeout_floor
    monkeypatch.setattr(deadlines, "probe_timeout_floor", lambda timeout: floor(timeout) + 100)
    raised = floor(PROFILE_RULES["readiness"].timeout) + 100
    assert any("readinessProbe: timeoutSeconds" in p and f"at least {raised}," in p
               for p in checker.check(K8S / "base")), raised


@pytest.mark.parametrize(("field", "profile"), [
    ("startupProbe", "startup"), ("readinessProbe", "readiness"), ("livenessProbe", "liveness")])
def test_timeout_not_above_the_deadline(checker: ModuleType, edit_deployment: Any, field: str, profile: str) -> None:
    deadline = int(PROFILE_RULES[profile].timeout)
    floor, term = probe_timeout_floor(deadline), deadlines.hard_stop(deadline)
    problems = checker.check(edit_deployment(lambda c: c[field].update(timeoutSeconds=deadline)))
    assert any(f"{field}: timeoutSeconds {deadline} is not above the {profile} deadline {deadline} s" in p
               and f"TERM at {term} s" in p and f"at least {floor}" in p for p in problems), problems
    # One second below the floor fails, the floor itself passes.
    assert checker.check(edit_deployment(lambda c: c[field].update(timeoutSeconds=floor - 1)))
    assert not [p for p in checker.check(edit_deployment(lambda c: c[field].update(timeoutSeconds=floor)))
                if "timeoutSeconds" in p]


def test_startup_budget_below_the_cold_start(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(lambda c: c["startupProbe"].update(failureThreshold=12)))
    assert any("startupProbe: budget 120 s" in p and "below the 300 s cold start" in p for p in problems), problems


def test_startup_budget_follows_the_cold_start_option(checker: ModuleType) -> None:
    problems = checker.check(K8S / "base", cold_start=900)
    assert any("budget 450 s" in p and "below the 900 s cold start" in p for p in problems), problems


def test_liveness_deeper_than_readiness(checker: ModuleType, edit_deployment: Any) -> None:
    base = edit_deployment(lambda c: c["livenessProbe"]["exec"].update(
        command=["healthcheck", "--profile", "readiness"]))
    problems = checker.check(base)
    assert any("livenessProbe: runs 'healthcheck --profile readiness'; expected 'healthcheck --profile "
               "liveness'" in p for p in problems), problems
    gpu = ", ".join(sorted(s.name for s in registry.PROBES if s.layer == "hardware" and "readiness" in s.profiles))
    assert gpu.startswith("nvidia-smi, nvml")
    assert any(f"livenessProbe: deeper than readiness (readiness profile runs {gpu})" in p
               for p in problems), problems


def test_liveness_slower_than_readiness(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(lambda c: c["livenessProbe"].update(timeoutSeconds=40)))
    assert any("livenessProbe: timeoutSeconds 40 is above readiness's 30" in p for p in problems), problems


def test_liveness_less_tolerant_than_readiness(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(lambda c: c["livenessProbe"].update(failureThreshold=2)))
    assert any("livenessProbe: restarts after 20 s of failures, readiness reacts after 20 s" in p
               for p in problems), problems


def test_readiness_too_slow(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(lambda c: c["readinessProbe"].update(failureThreshold=3)))
    assert any("readinessProbe: reacts in up to 85 s" in p for p in problems), problems


def test_wrong_profile_and_extra_flags(checker: ModuleType, edit_deployment: Any) -> None:
    def change(c: dict[str, Any]) -> None:
        c["startupProbe"]["exec"]["command"] = ["healthcheck", "--profile", "readiness"]
        c["readinessProbe"]["exec"]["command"] = ["healthcheck", "--profile", "readiness", "--skip", "nvml"]
    problems = checker.check(edit_deployment(change))
    assert any("startupProbe: runs 'healthcheck --profile readiness'; expected 'healthcheck --profile startup'"
               in p for p in problems), problems
    assert any("readinessProbe: runs 'healthcheck --profile readiness --skip nvml'" in p
               for p in problems), problems


def test_port_probe_is_refused(checker: ModuleType, edit_deployment: Any) -> None:
    def change(c: dict[str, Any]) -> None:
        c["livenessProbe"].pop("exec")
        c["livenessProbe"]["tcpSocket"] = {"port": 8888}
    problems = checker.check(edit_deployment(change))
    assert any("livenessProbe: is a tcpSocket probe" in p for p in problems), problems


def test_missing_probe(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(lambda c: c.pop("startupProbe")))
    assert any("container gpu-dev: has no startupProbe" in p for p in problems), problems


def test_env_overriding_the_deadlines(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(
        lambda c: c["env"].append({"name": "HEALTHCHECK_TIMEOUT", "value": "120"})))
    assert any("env sets HEALTHCHECK_TIMEOUT" in p for p in problems), problems


def test_gpu_count_above_the_limit(checker: ModuleType, edit_deployment: Any) -> None:
    problems = checker.check(edit_deployment(lambda c: c["env"][0].update(value="2")))
    assert any("HEALTHCHECK_GPU_COUNT=2 but the container asks for 1 nvidia.com/gpu" in p
               for p in problems), problems


def test_strategic_merge_patch_keeps_two_handlers(checker: ModuleType, k8s_copy: Path) -> None:
    """The classic overlay mistake: a strategic-merge patch adds httpGet next to exec."""
    overlay = k8s_copy / "overlays" / "http"
    (overlay / "smp.yaml").write_text(yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpu-dev"},
        "spec": {"template": {"spec": {"containers": [{
            "name": "gpu-dev", "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"}}}]}}}}))
    kust = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kust["patches"] = [{"path": "smp.yaml"}]  # instead of the JSON6902 replace
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    problems = checker.check(overlay)
    assert any("readinessProbe: has 2 handlers (exec, httpGet); exactly one is allowed" in p
               for p in problems), problems


def test_http_probe_without_serve(checker: ModuleType, k8s_copy: Path) -> None:
    overlay = k8s_copy / "overlays" / "http"
    ops = yaml.safe_load((overlay / "probes-http.yaml").read_text())
    ops = [op for op in ops if (op.get("value") or {}).get("name") != "HEALTHCHECK_SERVE"]
    (overlay / "probes-http.yaml").write_text(yaml.safe_dump(ops))
    problems = checker.check(overlay)
    assert any("livenessProbe: httpGet port 'health' is not where this container runs healthcheck serve "
               "(set HEALTHCHECK_SERVE=true" in p for p in problems), problems


def test_http_readiness_counts_the_serve_interval(checker: ModuleType, k8s_copy: Path) -> None:
    overlay = k8s_copy / "overlays" / "http"
    text = (overlay / "probes-http.yaml").read_text().replace("readiness=10", "readiness=40")
    (overlay / "probes-http.yaml").write_text(text)
    problems = checker.check(overlay)
    assert any("readinessProbe: reacts in up to 75 s (serve interval 40 s" in p for p in problems), problems


def test_kustomize_error_is_reported(checker: ModuleType, k8s_copy: Path) -> None:
    (k8s_copy / "base" / "service.yaml").unlink()
    [problem] = checker.check(k8s_copy / "base")
    assert "kubectl kustomize failed" in problem and "service.yaml" in problem


def test_cli_reports_each_problem_and_exits_1(edit_deployment: Any) -> None:
    base = edit_deployment(lambda c: c["readinessProbe"].pop("timeoutSeconds"))
    done = subprocess.run([*CLI, str(base)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "readinessProbe: has no timeoutSeconds" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_cli_usage_errors_exit_3(tmp_path: Path) -> None:
    done = subprocess.run([*CLI, str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert "no such kustomization directory or file" in done.stderr
    done = subprocess.run([*CLI, "--cold-start", "soon"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3


def test_rendered_file_input(checker: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "all.yaml"
    out.write_text(yaml.safe_dump_all(render(K8S / "overlays" / "http")))
    assert checker.check(out) == []
    out.write_text("kind: [unclosed\n")
    [problem] = checker.check(out)
    assert "not valid YAML" in problem


# --- security: as strict as sshd and Jupyter allow ---------------------------------------------

def test_base_is_locked_down() -> None:
    for rel in ("k8s/base", "k8s/overlays/http"):
        dep = deployment(ROOT / rel)
        pod = dep["spec"]["template"]["spec"]
        sc = container(dep)["securityContext"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert set(sc["capabilities"]["add"]) <= {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID",
                                                  "SYS_CHROOT", "KILL", "NET_BIND_SERVICE", "AUDIT_WRITE"}
        assert not container(dep)["image"].endswith(":latest")
        for meta in (dep["metadata"], dep["spec"]["template"]["metadata"]):
            assert meta["labels"]["app.kubernetes.io/version"] == container(dep)["image"].rsplit(":", 1)[1]


def test_copy_without_security_context_fails(checker: ModuleType, edit_deployment: Any) -> None:
    base = edit_deployment(lambda c: c.pop("securityContext"))
    problems = checker.check(base)
    assert any("has no securityContext: set allowPrivilegeEscalation: false" in p for p in problems), problems
    done = subprocess.run([*CLI, str(base)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "has no securityContext" in done.stdout


@pytest.mark.parametrize(("change", "needle"), [
    (lambda sc: sc.update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation is not false"),
    (lambda sc: sc.update(privileged=True), "securityContext.privileged is true"),
    (lambda sc: sc["capabilities"]["add"].append("SYS_ADMIN"), "capabilities.add has SYS_ADMIN"),
    (lambda sc: sc["capabilities"].update(drop=["NET_RAW"]), "capabilities.drop does not include ALL"),
])
def test_loosened_security_context_fails(checker: ModuleType, edit_deployment: Any, change: Any,
                                         needle: str) -> None:
    problems = checker.check(edit_deployment(lambda c: change(c["securityContext"])))
    assert any(needle in p for p in problems), problems


def _edit_pod(k8s_copy: Path, change: Any) -> Path:
    path = k8s_copy / "base" / "deployment.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return k8s_copy / "base"


def test_token_seccomp_and_labels_are_required(checker: ModuleType, k8s_copy: Path) -> None:
    def loosen(doc: dict[str, Any]) -> None:
        pod = doc["spec"]["template"]["spec"]
        del pod["automountServiceAccountToken"], pod["securityContext"]
        del pod["containers"][0]["securityContext"]["seccompProfile"]
        del doc["metadata"]["labels"]["app.kubernetes.io/version"]
    problems = checker.check(_edit_pod(k8s_copy, loosen))
    for needle in ("set automountServiceAccountToken: false", "no RuntimeDefault seccomp profile",
                   "metadata lacks the recommended labels app.kubernetes.io/version"):
        assert any(needle in p for p in problems), (needle, problems)


@pytest.mark.parametrize(("image", "ok"), [("gpu-dev:latest", False), ("registry.example.com:5000/gpu-dev", False),
                                           ("gpu-dev:1.2.3", True), ("gpu-dev@sha256:" + "a" * 64, True)])
def test_image_must_be_pinned(checker: ModuleType, tmp_path: Path, image: str, ok: bool) -> None:
    docs = render(K8S / "base")
    for d in docs:
        if d["kind"] == "Deployment":
            container(d)["image"] = image
    out = tmp_path / "all.yaml"
    out.write_text(yaml.safe_dump_all(docs))
    problems = [p for p in checker.check(out) if "is not pinned" in p]
    assert (problems == []) == ok, problems


def test_serve_in_a_post_start_hook_is_not_supervised(checker: ModuleType, k8s_copy: Path) -> None:
    overlay = k8s_copy / "overlays" / "http"
    ops = yaml.safe_load((overlay / "probes-http.yaml").read_text())
    ops = [op for op in ops if (op.get("value") or {}).get("name") != "HEALTHCHECK_SERVE"]
    ops.append({"op": "add", "path": "/spec/template/spec/containers/0/lifecycle", "value": {"postStart": {
        "exec": {"command": ["sh", "-c", "nohup healthcheck serve --host 0.0.0.0 --port 8779 &"]}}}})
    (overlay / "probes-http.yaml").write_text(yaml.safe_dump(ops))
    problems = checker.check(overlay)
    assert any("is not where this container runs healthcheck serve (set HEALTHCHECK_SERVE=true" in p
               for p in problems), problems
