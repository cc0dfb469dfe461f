"""/metrics (docs/serve.md): a collector on serve's own registry that reads one snapshot of the
monitor, never a probe or NVML. Per-GPU series carry dcgm-exporter's labels, to join with its.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator, Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from probes import __version__
from probes.hardware import xids
from probes.serve import PROFILES
from probes.serve.monitor import Monitor
from probes.serve.view import Snapshot, check_name, verdict
from probes.spec import PROFILE_RULES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STATUSES = ("pass", "warn", "fail", "skip")
WATCHER_STATES = ("running", "starting", "unavailable", "failed", "off")
# name, type and help of each family, in the exposition's order (docs/serve.md's table).
FAMILIES = (
    ("healthcheck_healthy", "gauge", "1 if the profile's endpoint would answer 200 (before readiness "
     "gating), else 0"),
    ("healthcheck_result_age_seconds", "gauge", "Age of the profile's latest result"),
    ("healthcheck_result_stale", "gauge", "1 if the latest result is older than interval + slack"),
    ("healthcheck_run_duration_seconds", "gauge", "Wall time of the profile's latest run"),
    ("healthcheck_probe_status", "gauge", "1 for the probe's status in the latest run of the profile"),
    # As kube-state-metrics' *_reason series: one per reason while it holds, so an alert can name it
    # without its own series changing; actor and action (the catalog's) route it to whoever can act.
    ("healthcheck_probe_reason", "gauge", "1 for the reason code of each check that warns, fails or did not "
     "run, as the profile's endpoint reports it (present only then), with who can act (actor: tenant or "
     "operator) and how (action)"),
    ("healthcheck_probe_duration_seconds", "gauge", "Time the probe took in the latest run"),
    ("healthcheck_probe_last_success_timestamp_seconds", "gauge", "When the probe last passed (or warned), "
     "Unix time"),
    ("healthcheck_runs", "counter", "Runs of each profile by outcome (pass, warn, fail, or why no report "
     "came: deadline, bad-output, ...)"),
    # One unlabelled series that a latch never swaps for another; its source is in healthcheck_latch_info.
    ("healthcheck_latched", "gauge", "1 while the container is latched unhealthy (critical Xid or fatal CUDA "
     "error) until it restarts, else 0"),
    ("healthcheck_latch", "info", "Why the container is latched (present only while latched)"),
    ("healthcheck_nvml_events", "counter", "NVML events seen while serving; action: what the event needs "
     "(NVIDIA's Xid catalog's immediate action)"),
    ("healthcheck_nvml_event_watch", "gauge", "1 for the state of the NVML Xid/ECC event watcher"),
    ("healthcheck_build", "info", "The suite's version, its Python, and the torch the torch-cuda probe found "
     "(empty until it ran)"),
    ("healthcheck_gpu_up", "gauge", "1 if NVML answered for the GPU without an error in the latest readiness "
     "(else startup) run, else 0"),
)
SUFFIX = {"counter": "_total", "info": "_info"}


def action(kind: str, xid: str) -> str:
    """What an event needs, whatever serve's latch policy says: for an Xid the catalog's resolution
    (``unknown`` when the table lacks it), a GPU reset for an uncorrectable ECC error, else nothing."""
    if kind == "xid":
        return xids.label(int(xid)) if xid.isdigit() and len(xid) < 6 else "unknown"
    return xids.LABELS[xids.RESET_GPU] if kind == "ecc-double" else "none"


def _facts(snap: Snapshot, probe: str) -> Mapping[str, Any]:
    """The probe's facts from the latest run of a profile that judges the hardware: one that keeps
    running (readiness) first, then the one run once per start (startup)."""
    for rules in sorted((p for p in PROFILE_RULES.values() if p.hardware), key=lambda p: p.once):
        run = snap.runs.get(rules.name)
        for key, entries in (run.report if run and run.report else {}).get("checks", {}).items():
            if check_name(key) == probe and entries:
                return entries[0].get("facts") or {}
    return {}


def samples(snap: Snapshot) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Each family's samples (labels, value), from one snapshot."""
    now, mono = time.time(), time.monotonic()
    bodies = {p: verdict(p, snap, now=now, now_mono=mono) for p in PROFILES}
    runs = [(p, snap.runs[p]) for p in PROFILES if p in snap.runs]
    checks = [(p, check_name(k), es[0]["status"], es[0].get("elapsed") or 0.0) for p, r in runs if r.report
              for k, es in r.report["checks"].items() if es]
    checks += [(p, check_name(k), "skip", 0.0) for p, r in runs if r.report for k in r.report["skipped"]]
    reasons: list[tuple[Any, ...]] = []  # the reason of each check that is not passing, once
    for p, (_, body) in bodies.items():
        for key, e in [*((k, es[0]) for k, es in body["checks"].items() if es and es[0]["status"] != "pass"),
                       *body.get("skipped", {}).items()]:
            row = (p, check_name(key), *(str(e.get(k) or "")[:40] for k in ("reason", "action", "actor")), 1)
            reasons += [row] if e.get("reason") and row not in reasons else []
    gpus = _facts(snap, "nvml").get("gpus") or []
    uuids = {str(g["index"]): g["uuid"] for g in gpus if g.get("uuid")}
    uuids.update({str(e.gpu): e.uuid for e in snap.events if e.gpu is not None and e.uuid})
    latch = snap.latch

    def of(names: tuple[str, ...], rows: Any) -> list[tuple[dict[str, str], float]]:
        return [(dict(zip(names, labels)), float(value)) for *labels, value in rows]

    profile, probe = ("profile",), ("profile", "probe")
    return {
        "healthcheck_healthy": of(profile, ((p, bodies[p][0] == 200) for p in PROFILES)),
        "healthcheck_result_age_seconds": of(profile, ((p, max(0.0, mono - r.finished_mono))
                                                       for p, r in runs)),
        "healthcheck_result_stale": of(profile, ((p, bodies[p][1]["reason"] == "stale") for p, _ in runs)),
        "healthcheck_run_duration_seconds": of(profile, ((p, r.duration) for p, r in runs)),
        "healthcheck_probe_status": of((*probe, "status"),
                                       ((p, n, s, s == got) for p, n, got, _ in checks for s in STATUSES)),
        "healthcheck_probe_reason": of((*probe, "reason", "action", "actor"), reasons),
        "healthcheck_probe_duration_seconds": of(probe, ((p, n, t) for p, n, _, t in checks)),
        "healthcheck_probe_last_success_timestamp_seconds": of(
            probe, ((*k, t) for k, t in sorted(snap.last_success.items()))),
        "healthcheck_runs": of(("profile", "outcome"), ((*k, n) for k, n in sorted(snap.runs_total.items()))),
        "healthcheck_latched": [({}, float(latch is not None))],
        "healthcheck_latch": [({"source": str(latch.get("source") or "unknown")[:80],
                                "code": str(latch.get("code") or "latched")[:40]}, 1.0)] if latch else [],
        "healthcheck_nvml_events": of(("gpu", "UUID", "kind", "xid", "severity", "action"), (
            (gpu, uuids.get(gpu, ""), kind, xid, sev, action(kind, xid), n)
            for (gpu, kind, xid, sev), n in sorted(snap.event_counts.items()))),
        "healthcheck_nvml_event_watch": of(("state",), ((s, snap.watcher == s) for s in WATCHER_STATES)),
        "healthcheck_build": [({"version": __version__, "python": platform.python_version(),
                                "torch": str(_facts(snap, "torch-cuda").get("torch") or "")}, 1.0)],
        "healthcheck_gpu_up": of(("gpu", "UUID", "modelName"), (
            (str(g["index"]), g.get("uuid", ""), g.get("name", ""), bool(g.get("ok"))) for g in gpus)),
    }


class HealthCollector(Collector):
    def __init__(self, monitor: Monitor):
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        found = samples(self.monitor.snap)
        for name, kind, doc in FAMILIES:
            family = Metric(name, doc, kind)
            for labels, value in found[name]:
                family.add_sample(name + SUFFIX.get(kind, ""), labels, value)
            yield family
